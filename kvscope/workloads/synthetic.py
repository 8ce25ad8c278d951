"""Synthetic closed-loop workloads for the built-in scenarios (numbers from the incident report).

Size: one constructor per built-in synthetic scenario, each with its description: a table of
scenarios, not one mechanism.

- ``shared-prefix``: the report's minimal reproduction without agentic traffic: many long prompts
  (default 100,000-token prefix + 1,000-30,000 unique tokens) sharing ONE prefix, kept at
  ``requests_in_flight`` (16+) concurrency; each request is its own one-turn client, replaced at once
  when it finishes. With reuse on the target holds the prefix once while every unpaired draft
  mirror holds its own full copy.
- ``qwen-hybrid``: 12 clients, each with its own long prefix: a warm-up request of the prefix alone,
  then (when it finished) an ~81k-token follow-up sharing it, with a 32,768-token output cap (the
  follow-up generates up to the cap: the report's worst case).
- ``near-miss``: shared-prefix traffic with FIXED lengths, so the unpaired draft mirrors' peak demand
  is known exactly (``peak_draft_blocks``); the scenario sizes the draft pool so it peaks at >= 90%
  without a failure.
- ``oversize``: normal requests with one (or more) prompt larger than the draft pool (and so, on the
  glm5-dsa engine, larger than max_seq_len: rejected at arrival).

All lengths are drawn from ``random.Random(seed)`` in request order: deterministic per seed. Keys:
a block of a shared prefix is keyed by (prefix namespace, position); every other block by (the
request's own namespace, position), so it matches nothing else (see workload.py for the packing).
"""

from __future__ import annotations

import random
from typing import Any

from .closed_loop import ClosedLoopSession, ClosedLoopWorkload
from .workload import check_tokens_per_block, make_block_key

__all__ = [
    "NearMissWorkload",
    "OversizeWorkload",
    "QwenFollowupWorkload",
    "SharedPrefixWorkload",
    "create_near_miss_workload",
    "create_oversize_workload",
    "create_qwen_followup_workload",
    "create_shared_prefix_workload",
]

_Turn = tuple[int, int, float, tuple[int, ...]]  # prompt_len, output_len, think_s, block_keys


def prefix_keys(
    prompt_len: int, tokens_per_block: int, prefix_ns: int, prefix_tokens: int, own_ns: int
) -> tuple[int, ...]:
    """Keys of a prompt = shared prefix (prefix_ns) + own tokens (own_ns), full blocks only.

    A block that straddles the prefix end holds own tokens, so it is keyed in own_ns.
    """
    num_blocks = prompt_len // tokens_per_block
    num_shared = min(prefix_tokens // tokens_per_block, num_blocks)
    return tuple(make_block_key(prefix_ns, i, 1) for i in range(num_shared)) + tuple(
        make_block_key(own_ns, i, 1) for i in range(num_shared, num_blocks)
    )


class _ScriptSession(ClosedLoopSession):
    """One client: a single chain of precomputed turns."""

    def __init__(self, session_id: int, turns: list[_Turn]) -> None:
        self.session_id = session_id
        self.turns = turns

    def num_chains(self) -> int:
        return 1

    def num_turns(self, chain: int) -> int:
        return len(self.turns)

    def start_delays(self) -> list[tuple[int, float]]:
        return [(0, 0.0)]

    def unlocked_by(self, chain: int, turn: int) -> list[tuple[int, float]]:
        return []

    def think_s(self, chain: int, turn: int) -> float:
        return self.turns[turn][2]

    def build_request(self, chain: int, turn: int) -> tuple[int, int, tuple[int, ...]]:
        prompt_len, output_len, _, keys = self.turns[turn]
        return prompt_len, output_len, keys


class _WarmThenFollowSession(ClosedLoopSession):
    """One client script driving every client: the prefixes are warmed ``k`` at a time (chain ``c``
    warms clients ``c, c + k, ...`` one after another), and once every warm-up has finished, each
    client's follow-up is sent at once (chains ``k ..``), as a script that first warms, then fires."""

    def __init__(self, warm: list[_Turn], follow: list[_Turn], concurrency: int) -> None:
        self.session_id = 0
        k = max(1, min(concurrency, len(warm)))
        self._warm_chains = [warm[c::k] for c in range(k)]
        self._follow = follow
        self._warm_chains_left = k

    def num_chains(self) -> int:
        return len(self._warm_chains) + len(self._follow)

    def _turn(self, chain: int, turn: int) -> _Turn:
        k = len(self._warm_chains)
        return self._warm_chains[chain][turn] if chain < k else self._follow[chain - k]

    def num_turns(self, chain: int) -> int:
        k = len(self._warm_chains)
        return len(self._warm_chains[chain]) if chain < k else 1

    def start_delays(self) -> list[tuple[int, float]]:
        return [(c, 0.0) for c in range(len(self._warm_chains))]

    def unlocked_by(self, chain: int, turn: int) -> list[tuple[int, float]]:
        k = len(self._warm_chains)
        if chain >= k or turn + 1 < len(self._warm_chains[chain]):
            return []
        self._warm_chains_left -= 1
        if self._warm_chains_left:
            return []
        return [(k + i, think) for i, (_, _, think, _) in enumerate(self._follow)]

    def think_s(self, chain: int, turn: int) -> float:
        return self._turn(chain, turn)[2]

    def build_request(self, chain: int, turn: int) -> tuple[int, int, tuple[int, ...]]:
        prompt_len, output_len, _, keys = self._turn(chain, turn)
        return prompt_len, output_len, keys


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _check_range(low_name: str, low: int, high_name: str, high: int) -> None:
    _check_positive(**{low_name: low, high_name: high})
    if low > high:
        raise ValueError(f"{low_name} must be <= {high_name}, got {low} > {high}")


class SharedPrefixWorkload(ClosedLoopWorkload):
    """Long prompts sharing one prefix at fixed concurrency (``shared-prefix``).

    Args:
        tokens_per_block: the engine's tokens per block.
        seed: fixes the drawn lengths.
        requests_in_flight: concurrency (>= 1; the report's minimal reproduction uses 16+).
        max_think_time_s: accepted for a uniform constructor (one-turn clients never think).
        max_requests: requests in total (None: 64).
        prefix_tokens: the shared prefix (tokens).
        min_suffix_tokens / max_suffix_tokens: unique tokens after the prefix, uniform.
        min_output_tokens / max_output_tokens: tokens generated, uniform.
    """

    KIND = "shared-prefix"
    DEFAULT_MAX_REQUESTS = 64

    def __init__(
        self,
        tokens_per_block: int,
        seed: int = 0,
        *,
        requests_in_flight: int = 24,
        max_think_time_s: float | None = None,
        max_requests: int | None = None,
        prefix_tokens: int = 100_000,
        min_suffix_tokens: int = 1_000,
        max_suffix_tokens: int = 30_000,
        min_output_tokens: int = 200,
        max_output_tokens: int = 1_000,
    ) -> None:
        check_tokens_per_block(tokens_per_block)
        _check_positive(prefix_tokens=prefix_tokens)
        _check_range("min_suffix_tokens", min_suffix_tokens, "max_suffix_tokens", max_suffix_tokens)
        _check_range("min_output_tokens", min_output_tokens, "max_output_tokens", max_output_tokens)
        super().__init__(
            tokens_per_block,
            requests_in_flight=requests_in_flight,
            max_think_time_s=max_think_time_s,
            max_requests=self.DEFAULT_MAX_REQUESTS if max_requests is None else max_requests,
            end_session_on_failure=False,
        )
        self.seed = seed
        self.prefix_tokens = prefix_tokens
        self.min_suffix_tokens = min_suffix_tokens
        self.max_suffix_tokens = max_suffix_tokens
        self.min_output_tokens = min_output_tokens
        self.max_output_tokens = max_output_tokens
        self._rng = random.Random(seed)

    def _next_session(self) -> ClosedLoopSession | None:
        index = self.num_sessions_started
        assert self.max_requests is not None
        if index >= self.max_requests:
            return None
        suffix = self._rng.randint(self.min_suffix_tokens, self.max_suffix_tokens)
        output = self._rng.randint(self.min_output_tokens, self.max_output_tokens)
        prompt = self.prefix_tokens + suffix
        keys = prefix_keys(prompt, self.tokens_per_block, 1, self.prefix_tokens, 2 + index)
        return _ScriptSession(index, [(prompt, output, 0.0, keys)])

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.KIND,
            "tokens_per_block": self.tokens_per_block,
            "seed": self.seed,
            "requests_in_flight": self.requests_in_flight,
            "max_requests": self.max_requests,
            "prefix_tokens": self.prefix_tokens,
            "min_suffix_tokens": self.min_suffix_tokens,
            "max_suffix_tokens": self.max_suffix_tokens,
            "min_output_tokens": self.min_output_tokens,
            "max_output_tokens": self.max_output_tokens,
        }


class NearMissWorkload(SharedPrefixWorkload):
    """Shared-prefix traffic with fixed lengths, so the draft mirrors' peak is known (``near-miss``).

    Args:
        tokens_per_block, seed, requests_in_flight, max_think_time_s, max_requests: as
            ``SharedPrefixWorkload`` (max_requests None: 48).
        prefix_tokens: the shared prefix (tokens).
        suffix_tokens: unique tokens per request.
        output_tokens: tokens generated per request.
    """

    KIND = "near-miss"
    DEFAULT_MAX_REQUESTS = 48

    def __init__(
        self,
        tokens_per_block: int,
        seed: int = 0,
        *,
        requests_in_flight: int = 16,
        max_think_time_s: float | None = None,
        max_requests: int | None = None,
        prefix_tokens: int = 64_000,
        suffix_tokens: int = 8_000,
        output_tokens: int = 2_000,
    ) -> None:
        super().__init__(
            tokens_per_block,
            seed,
            requests_in_flight=requests_in_flight,
            max_think_time_s=max_think_time_s,
            max_requests=max_requests,
            prefix_tokens=prefix_tokens,
            min_suffix_tokens=suffix_tokens,
            max_suffix_tokens=suffix_tokens,
            min_output_tokens=output_tokens,
            max_output_tokens=output_tokens,
        )

    def draft_blocks_per_request(self, max_draft_len: int = 0, extra_tokens: int = 0) -> int:
        """Blocks one unpaired draft mirror holds at its largest: the whole prompt (no reuse), every
        generated token, plus the draft and extra tokens, rounded up to full blocks."""
        tokens = self.prefix_tokens + self.min_suffix_tokens + self.min_output_tokens
        tokens += max_draft_len + extra_tokens
        return -(-tokens // self.tokens_per_block)

    def peak_draft_blocks(self, max_draft_len: int = 0, extra_tokens: int = 0) -> int:
        """Upper bound of the draft pool's demand: every in-flight request at its largest."""
        return self.requests_in_flight * self.draft_blocks_per_request(max_draft_len, extra_tokens)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        for name in (
            "min_suffix_tokens",
            "max_suffix_tokens",
            "min_output_tokens",
            "max_output_tokens",
        ):
            out.pop(name)
        out["suffix_tokens"] = self.min_suffix_tokens
        out["output_tokens"] = self.min_output_tokens
        return out


class QwenFollowupWorkload(ClosedLoopWorkload):
    """Clients that warm their own long prefix, then send a follow-up sharing it (``qwen-hybrid``).

    Args:
        tokens_per_block: the engine's tokens per block.
        seed: fixes the jitter of the lengths.
        requests_in_flight: sessions start while fewer requests are outstanding (None: num_clients).
        max_think_time_s: cap on ``followup_think_s``.
        max_requests: requests in total (None: 2 * num_clients).
        num_clients: clients, each a warm-up then a follow-up.
        prefix_tokens: each client's own prefix (the warm-up prompt).
        followup_tokens: the follow-up prompt (prefix + new tokens; >= prefix_tokens).
        warm_output_tokens: tokens the warm-up generates.
        followup_output_tokens: tokens the follow-up generates (the report's 32,768 cap).
        followup_think_s: delay between the warm-up's finish and the follow-up.
        prompt_jitter: each client's prefix and follow-up are scaled by 1 + U(-j, j) (0 <= j < 1).
        warmup_concurrency: 0: each client warms its prefix and sends its follow-up on its own (every
            client warms at once); k >= 1: one script warms the prefixes k at a time and, once all are
            warm, sends every follow-up at once.
    """

    def __init__(
        self,
        tokens_per_block: int,
        seed: int = 0,
        *,
        requests_in_flight: int | None = None,
        max_think_time_s: float | None = None,
        max_requests: int | None = None,
        num_clients: int = 12,
        prefix_tokens: int = 80_000,
        followup_tokens: int = 81_000,
        warm_output_tokens: int = 16,
        followup_output_tokens: int = 32_768,
        followup_think_s: float = 0.0,
        prompt_jitter: float = 0.0,
        warmup_concurrency: int = 0,
    ) -> None:
        check_tokens_per_block(tokens_per_block)
        if isinstance(warmup_concurrency, bool) or not isinstance(warmup_concurrency, int) or warmup_concurrency < 0:
            raise ValueError(f"warmup_concurrency must be an int >= 0, got {warmup_concurrency!r}")
        _check_positive(
            num_clients=num_clients,
            warm_output_tokens=warm_output_tokens,
            followup_output_tokens=followup_output_tokens,
        )
        _check_range("prefix_tokens", prefix_tokens, "followup_tokens", followup_tokens)
        if not followup_think_s >= 0:
            raise ValueError(f"followup_think_s must be >= 0, got {followup_think_s}")
        if not 0 <= prompt_jitter < 1:
            raise ValueError(f"prompt_jitter must be in [0, 1), got {prompt_jitter}")
        super().__init__(
            tokens_per_block,
            requests_in_flight=num_clients if requests_in_flight is None else requests_in_flight,
            max_think_time_s=max_think_time_s,
            max_requests=2 * num_clients if max_requests is None else max_requests,
            end_session_on_failure=True,
        )
        self.seed = seed
        self.num_clients = num_clients
        self.prefix_tokens = prefix_tokens
        self.followup_tokens = followup_tokens
        self.warm_output_tokens = warm_output_tokens
        self.followup_output_tokens = followup_output_tokens
        self.followup_think_s = float(followup_think_s)
        self.prompt_jitter = float(prompt_jitter)
        self.warmup_concurrency = warmup_concurrency
        self._rng = random.Random(seed)

    def _next_session(self) -> ClosedLoopSession | None:
        if self.warmup_concurrency:
            if self.num_sessions_started:
                return None
            scripts = [self._client_turns(client) for client in range(self.num_clients)]
            return _WarmThenFollowSession([w for w, _ in scripts], [f for _, f in scripts],
                                          self.warmup_concurrency)
        client = self.num_sessions_started
        if client >= self.num_clients:
            return None
        warm, follow = self._client_turns(client)
        return _ScriptSession(client, [warm, follow])

    def _client_turns(self, client: int) -> tuple[_Turn, _Turn]:
        """Client ``client``'s warm-up and follow-up (prompt, output, think time, block keys)."""
        scale = 1.0 + self._rng.uniform(-self.prompt_jitter, self.prompt_jitter)
        prefix = max(1, round(self.prefix_tokens * scale))
        followup = max(prefix, round(self.followup_tokens * scale))
        tpb = self.tokens_per_block
        prefix_ns, own_ns = 1 + 2 * client, 2 + 2 * client
        warm_keys = prefix_keys(prefix, tpb, prefix_ns, prefix, prefix_ns)
        follow_keys = prefix_keys(followup, tpb, prefix_ns, prefix, own_ns)
        return ((prefix, self.warm_output_tokens, 0.0, warm_keys),
                (followup, self.followup_output_tokens, self.followup_think_s, follow_keys))

    def describe(self) -> dict[str, Any]:
        return {
            "workload": "qwen-followup",
            "tokens_per_block": self.tokens_per_block,
            "seed": self.seed,
            "requests_in_flight": self.requests_in_flight,
            "max_think_time_s": self.max_think_time_s,
            "max_requests": self.max_requests,
            "num_clients": self.num_clients,
            "prefix_tokens": self.prefix_tokens,
            "followup_tokens": self.followup_tokens,
            "warm_output_tokens": self.warm_output_tokens,
            "followup_output_tokens": self.followup_output_tokens,
            "followup_think_s": self.followup_think_s,
            "prompt_jitter": self.prompt_jitter,
            "warmup_concurrency": self.warmup_concurrency,
        }


class OversizeWorkload(ClosedLoopWorkload):
    """Normal requests with ``num_oversize`` prompts larger than the draft pool (``oversize``).

    The oversize prompts are spread evenly through the stream (request indices
    ``(k + 1) * max_requests // (num_oversize + 1)``). Their size is ``oversize_prompt_tokens``, or,
    when ``draft_pool_blocks`` is given, one block more than that pool holds.

    Args:
        tokens_per_block: the engine's tokens per block.
        seed: fixes the normal requests' drawn lengths.
        requests_in_flight: concurrency (>= 1).
        max_think_time_s: accepted for a uniform constructor (one-turn clients never think).
        max_requests: requests in total, oversize ones included (None: 16).
        min_prompt_tokens / max_prompt_tokens: normal prompts, uniform; each is its own prefix.
        output_tokens: tokens every request generates.
        num_oversize: oversize requests among them (>= 1, < max_requests + 1).
        oversize_prompt_tokens: their prompt (default 1,300,000: over glm5-dsa's ~1.27M-token draft
            pool and its 262,144 max_seq_len).
        draft_pool_blocks: when given, oversize prompts are (draft_pool_blocks + 1) blocks.
    """

    def __init__(
        self,
        tokens_per_block: int,
        seed: int = 0,
        *,
        requests_in_flight: int = 4,
        max_think_time_s: float | None = None,
        max_requests: int | None = None,
        min_prompt_tokens: int = 2_000,
        max_prompt_tokens: int = 16_000,
        output_tokens: int = 256,
        num_oversize: int = 1,
        oversize_prompt_tokens: int = 1_300_000,
        draft_pool_blocks: int | None = None,
    ) -> None:
        check_tokens_per_block(tokens_per_block)
        _check_range("min_prompt_tokens", min_prompt_tokens, "max_prompt_tokens", max_prompt_tokens)
        _check_positive(output_tokens=output_tokens, num_oversize=num_oversize)
        if draft_pool_blocks is not None:
            _check_positive(draft_pool_blocks=draft_pool_blocks)
            oversize_prompt_tokens = (draft_pool_blocks + 1) * tokens_per_block
        _check_positive(oversize_prompt_tokens=oversize_prompt_tokens)
        total = 16 if max_requests is None else max_requests
        if num_oversize > total:
            raise ValueError(f"num_oversize must be <= max_requests, got {num_oversize} > {total}")
        super().__init__(
            tokens_per_block,
            requests_in_flight=requests_in_flight,
            max_think_time_s=max_think_time_s,
            max_requests=total,
            end_session_on_failure=False,
        )
        self.seed = seed
        self.min_prompt_tokens = min_prompt_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.output_tokens = output_tokens
        self.num_oversize = num_oversize
        self.oversize_prompt_tokens = oversize_prompt_tokens
        self.draft_pool_blocks = draft_pool_blocks
        self.oversize_indices = frozenset(
            min(total - 1, (k + 1) * total // (num_oversize + 1)) for k in range(num_oversize)
        )
        self._rng = random.Random(seed)

    def _next_session(self) -> ClosedLoopSession | None:
        index = self.num_sessions_started
        assert self.max_requests is not None
        if index >= self.max_requests:
            return None
        drawn = self._rng.randint(self.min_prompt_tokens, self.max_prompt_tokens)
        prompt = self.oversize_prompt_tokens if index in self.oversize_indices else drawn
        keys = prefix_keys(prompt, self.tokens_per_block, 1 + index, 0, 1 + index)
        return _ScriptSession(index, [(prompt, self.output_tokens, 0.0, keys)])

    def describe(self) -> dict[str, Any]:
        return {
            "workload": "oversize",
            "tokens_per_block": self.tokens_per_block,
            "seed": self.seed,
            "requests_in_flight": self.requests_in_flight,
            "max_requests": self.max_requests,
            "min_prompt_tokens": self.min_prompt_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "output_tokens": self.output_tokens,
            "num_oversize": self.num_oversize,
            "oversize_prompt_tokens": self.oversize_prompt_tokens,
            "draft_pool_blocks": self.draft_pool_blocks,
        }


def create_shared_prefix_workload(**kwargs: Any) -> SharedPrefixWorkload:
    """Factory for the ``shared-prefix`` scenario (keyword arguments of ``SharedPrefixWorkload``)."""
    return SharedPrefixWorkload(**kwargs)


def create_near_miss_workload(**kwargs: Any) -> NearMissWorkload:
    """Factory for the ``near-miss`` scenario (keyword arguments of ``NearMissWorkload``)."""
    return NearMissWorkload(**kwargs)


def create_qwen_followup_workload(**kwargs: Any) -> QwenFollowupWorkload:
    """Factory for the ``qwen-hybrid-mtp`` scenario (keyword arguments of ``QwenFollowupWorkload``)."""
    return QwenFollowupWorkload(**kwargs)


def create_oversize_workload(**kwargs: Any) -> OversizeWorkload:
    """Factory for the ``oversize`` scenario (keyword arguments of ``OversizeWorkload``)."""
    return OversizeWorkload(**kwargs)
