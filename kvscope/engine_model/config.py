"""EngineConfig: every knob of the engine model, named after the real engine's config where one exists.

Real names (TensorRT-LLM ``LlmArgs`` / ``KvCacheConfig`` / ``KVCacheManagerV2`` kwargs):
``max_batch_size``, ``max_num_tokens``, ``max_seq_len``, ``tokens_per_block``,
``enable_block_reuse``, ``max_draft_len``, ``max_util_for_resume``, ``enable_chunked_prefill``,
``max_gpu_total_bytes``, ``num_extra_kv_tokens``, ``num_reserved_index_slots``, ``pp_size`` /
``tp_size`` (``Mapping``). Everything else is the model's own (pool sizes in blocks, draft pairing,
workload pacing, cost-model constants) and says so in its description.

Pool capacities are either given in blocks (``num_target_blocks`` / ``num_draft_blocks``) or derived
from one GPU byte budget exactly like ``KvCacheCreator._split_kv_cache_budget_for_draft`` /
``_compute_draft_budget_shares`` (``tensorrt_llm/_torch/pyexecutor/_util.py``, stored version
d8ae02caed59708512e5aa578a09bb09f365bfed; the map reads it at 0004396720054fd8e205cbf616f21f0b57c6b412):
the costs are affine (bytes/token slope plus a fixed intercept, e.g. mamba state); the draft gets its
intercept plus ``(budget - both intercepts) * draft_slope / (target_slope + draft_slope)`` (integer
floor), the target the rest. Both pools then hold about the same number of TOKENS, in proportion to
their bytes/token.

``EngineConfig.with_overrides(["key=value", ...])`` parses ``--set`` pairs with type coercion and a
clear error for unknown keys (naming the nearest). Every numeric knob declares its range
(:class:`KnobRange`) beside its default and help; validation runs once at construction with messages
that state the rule and the range.

Size: one declaration per knob (default, help, range) and the rules between knobs, over 400 lines
since every knob carries its range; split, a knob and the range that bounds it would drift apart.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from .versions import ENGINE_BUILDS, NEWEST, EngineBuild, get_engine_build

_GIB = 1 << 30


class DraftMode(str, Enum):
    """How the one-model draft manager relates to admission.

    ``unpaired``: today's default; the scheduler sizes only the target, the draft mirror is created
    without prefix match, never publishes, and is sized in ``prepare_resources`` (can only raise).
    ``paired``: joint KV cache reuse (#18093): the scheduler allocates and reverts both pools together
    and the draft reuses prefixes (``joint_kv_cache_reuse=True`` on the real managers).
    """

    UNPAIRED = "unpaired"
    PAIRED = "paired"


class DraftCursorSizing(str, Enum):
    """What the draft mirror's context resize is sized from (report fact; PR #19231 is ``chunk``).

    ``chunk``: the target's cursor: position + chunk (+ draft_len on the last chunk) + extra tokens.
    ``prompt``: a near-full prompt cursor, as the qwen-hybrid report observed: the whole prompt
    (+ draft_len + extra tokens) on the first chunk already.
    """

    PROMPT = "prompt"
    CHUNK = "chunk"


CLIENT_MAX_TOKENS_NONE = "none"
CLIENT_MAX_TOKENS_ACTUAL = "actual"


def client_max_tokens_cap(value: str) -> int | None:
    """The number a ``client_max_tokens`` knob value caps output at: None for ``none`` (TensorRT-LLM
    deduces the largest that fits) and for ``actual`` (the trace's own length, foresight); ValueError
    on anything else than those two words or an integer >= 1."""
    text = str(value).strip().lower()
    if text in (CLIENT_MAX_TOKENS_NONE, CLIENT_MAX_TOKENS_ACTUAL):
        return None
    try:
        cap = int(text)
    except ValueError:
        raise ValueError(f"client_max_tokens must be none, actual or an integer >= 1, got {value!r}") from None
    if cap < 1:
        raise ValueError(f"client_max_tokens must be none, actual or an integer >= 1, got {value!r}")
    return cap


@dataclass(frozen=True, slots=True)
class KnobRange:
    """The values a numeric knob accepts: ``low`` to ``high`` inclusive (``low`` itself excluded
    when ``low_open``), plus one ``sentinel`` below ``low`` with its meaning (``(-1, "derived")``)."""

    low: float
    high: float
    low_open: bool = False
    sentinel: tuple[float, str] | None = None

    def contains(self, value: float) -> bool:
        if self.sentinel is not None and value == self.sentinel[0]:
            return True
        return (value > self.low if self.low_open else value >= self.low) and value <= self.high

    def text(self) -> str:
        """``[1, 65536]``, ``(0, 1]``, ``[0, 86400] or -1 (derived)``."""
        text = f"{'(' if self.low_open else '['}{_bound(self.low)}, {_bound(self.high)}]"
        if self.sentinel is not None:
            text += f" or {_bound(self.sentinel[0])} ({self.sentinel[1]})"
        return text

    def violation(self, name: str, value: float) -> str:
        """The one-line message for a value outside the range (it always states the range)."""
        if value > self.high:
            return f"{name} must be in {self.text()}, got {_got(value)}"
        if self.low_open:
            rule = f"> {_bound(self.low)}"
        elif self.low == 1 and isinstance(self.low, int):
            rule = "> 0"
        else:
            rule = f">= {_bound(self.low)}"
        if self.sentinel is not None:
            rule += f" or {_bound(self.sentinel[0])} ({self.sentinel[1]})"
        return f"{name} must be {rule}, got {_got(value)} (range: {self.text()})"


# Counted, never allocated per unit (pool blocks and slots are O(1) counters): the bound refuses only
# values no replay could reach, and keeps every product with tokens_per_block inside int64.
_COUNT_MAX = 2**31 - 1
# A request count the IndexMapper allocates a slot for (a list entry per slot).
_SLOTS_MAX = 65536
# Tokens of one sequence or iteration: above the longest context windows served today (10M).
_TOKENS_MAX = 1 << 24
# Bytes: above any GPU's memory (the budget is one rank's KV cache).
_BYTES_MAX = 1 << 40
_DAY_S = 86400.0


def _knob(default: Any, help_text: str, *, real: bool = False,
          bounds: KnobRange | None = None) -> Any:
    return field(default=default, metadata={"help": help_text, "real": real, "bounds": bounds})


def _bound(value: float) -> str:
    """A range's end: integers exact, floats short (``86400``, ``1e+06``)."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def _got(value: float) -> str:
    """The value a range message refuses, as given (``-2.0``); a huge integer as ``1e+30``."""
    if isinstance(value, int) and abs(value) >= 10**16:
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Knobs of one replay. Frozen; derive variants with ``dataclasses.replace`` or ``with_overrides``."""

    # --- engine (real names) ---
    max_batch_size: int = _knob(
        64, "requests per iteration (scheduler capacity)", real=True,
        bounds=KnobRange(1, _SLOTS_MAX))
    max_num_tokens: int = _knob(
        8192, "token budget per iteration (chunked prefill)", real=True,
        bounds=KnobRange(1, _TOKENS_MAX))
    max_seq_len: int = _knob(
        262144, "longest sequence; longer prompts are rejected at arrival", real=True,
        bounds=KnobRange(1, _TOKENS_MAX))
    tokens_per_block: int = _knob(
        64, "tokens per KV block (kv_cache_config.tokens_per_block)", real=True,
        bounds=KnobRange(1, 4096))
    enable_block_reuse: bool = _knob(True, "prefix block reuse in the target pool", real=True)
    enable_chunked_prefill: bool = _knob(True, "split prompts into chunks under max_num_tokens", real=True)
    max_draft_len: int = _knob(
        1, "MTP draft tokens per step (0: no speculation, no draft pool)", real=True,
        bounds=KnobRange(0, 64))
    max_util_for_resume: float = _knob(
        0.95, "resume refused above this GPU pool utilisation", real=True,
        bounds=KnobRange(0.0, 1.0, low_open=True))
    num_extra_kv_tokens: int = _knob(
        -1, "extra KV tokens per request (-1: get_num_extra_kv_tokens, i.e. max_draft_len - 1 for one-model MTP)",
        real=True, bounds=KnobRange(-1, 4096))
    num_reserved_index_slots: int = _knob(
        1, "IndexMapper slots beyond max_batch_size x pp", real=True,
        bounds=KnobRange(0, _SLOTS_MAX))
    pp_size: int = _knob(
        1, "pipeline-parallel stages (draft manager on the last stage)", real=True,
        bounds=KnobRange(1, 64))
    tp_size: int = _knob(
        1, "tensor-parallel ranks per stage (same decisions)", real=True,
        bounds=KnobRange(1, 1024))
    max_gpu_total_bytes: int = _knob(
        64_972_117_770, "GPU KV budget in bytes split target/draft (0: use block counts)", real=True,
        bounds=KnobRange(0, _BYTES_MAX))
    engine_version: str = _knob(
        NEWEST.version, f"TensorRT-LLM build the model follows: {' | '.join(ENGINE_BUILDS)} (alias: main)")
    defer_draft_resize: bool = _knob(
        False, "model-only counterfactual of open PR #19231 (main-00746ef only): the scheduler sizes the unpaired "
               "mirror for each context chunk and generation step and defers the request when the draft refuses, "
               "instead of a raise in prepare_resources")
    fix_19120: bool = _knob(False, "apply PR #19120's proposed fix for #18661 (reclaim clamped at the history, "
                                   "unpaired mirror records its draft slots and advances its context history)")
    # --- pools (model) ---
    num_target_blocks: int = _knob(
        0, "target pool blocks (0: derive from max_gpu_total_bytes)",
        bounds=KnobRange(0, _COUNT_MAX))
    num_draft_blocks: int = _knob(
        0, "draft pool blocks (0: derive from max_gpu_total_bytes)",
        bounds=KnobRange(0, _COUNT_MAX))
    target_bytes_per_token: int = _knob(
        49968, "target cost slope for the budget split (B/token)",
        bounds=KnobRange(1, 1 << 30))
    draft_bytes_per_token: int = _knob(
        1284, "draft cost slope for the budget split (B/token)",
        bounds=KnobRange(0, 1 << 30))
    target_fixed_bytes: int = _knob(
        0, "target cost intercept (e.g. mamba state) for the split",
        bounds=KnobRange(0, _BYTES_MAX))
    draft_fixed_bytes: int = _knob(
        0, "draft cost intercept for the split",
        bounds=KnobRange(0, _BYTES_MAX))
    num_host_blocks: int = _knob(
        0, "host-tier blocks per pool for suspended pages (0: none)",
        bounds=KnobRange(0, _COUNT_MAX))
    last_stage_num_host_blocks: int = _knob(
        -1, "host-tier blocks per pool on the last PP stage when it differs from the first (each rank sizes "
            "its own host tier; 0: none, as after a failed cuMemHostRegister; -1: the same, one replica)",
        bounds=KnobRange(-1, _COUNT_MAX))
    num_mamba_slots: int = _knob(
        0, "mamba state slots of a hybrid target (live states + snapshots; 0: not hybrid)",
        bounds=KnobRange(0, _COUNT_MAX))
    mamba_snapshot_interval: int = _knob(
        0, "tokens between mamba state snapshots (prefix reuse resumes at one; 0: none)",
        bounds=KnobRange(0, _TOKENS_MAX))
    draft_mode: DraftMode = _knob(DraftMode.UNPAIRED, "unpaired (today) or paired (joint reuse)")
    draft_cursor_sizing: DraftCursorSizing = _knob(DraftCursorSizing.CHUNK, "draft context resize from prompt|chunk")
    # --- workload (model) ---
    requests_in_flight: int = _knob(
        24, "closed loop: requests kept in flight",
        bounds=KnobRange(1, _SLOTS_MAX))
    think_time_cap_s: float = _knob(
        60.0, "closed loop: cap on recorded think time (s; -1: no cap)",
        bounds=KnobRange(0.0, _DAY_S, sentinel=(-1.0, "no cap")))
    share_system_prefix: bool = _knob(True, "share the tools+system prefix across sessions")
    session_start_interval_s: float = _knob(
        -1.0, "Claude Code traces: least time between two session starts (s; -1: the traces' mean request "
              "cycle 28.67 s / requests_in_flight, 1.19 s at 24, no start-up burst; 0: all start at t=0, a burst)",
        bounds=KnobRange(0.0, _DAY_S, sentinel=(-1.0, "derived")))
    warmup_concurrency: int = _knob(
        0, "qwen-hybrid-mtp clients: 0: each client warms its prefix and sends its follow-up on its own (all "
           "warm at once); k >= 1: the prefixes are warmed k at a time, then every follow-up is sent together",
        bounds=KnobRange(0, _SLOTS_MAX))
    client_max_tokens: str = _knob(
        "none", "max_tokens the clients send: none (TensorRT-LLM deduces max_seq_len - prompt), a number N "
                "(the request stops at N; max_new_tokens = min(N, max_seq_len - prompt)), or actual (FORESIGHT: "
                "max_new_tokens = the trace's output length, which no real client sends; comparison rows only)")
    cancel_rate: float = _knob(
        0.0, "fraction of requests the client cancels, drawn per request from the seed (0: none)",
        bounds=KnobRange(0.0, 1.0))
    cancel_after_s: float = _knob(
        10.0, "mean delay from a request's arrival to its cancellation (s; exponential; 0: at arrival)",
        bounds=KnobRange(0.0, _DAY_S))
    max_requests: int = _knob(
        0, "stop admitting after this many requests (0: workload default)",
        bounds=KnobRange(0, _COUNT_MAX))
    max_sessions: int = _knob(
        0, "sessions to replay (0: workload default)",
        bounds=KnobRange(0, _COUNT_MAX))
    arrival_time_scale: float = _knob(
        1.0, "open loop: multiplies trace arrival times (2: half the rate)",
        bounds=KnobRange(0.0, 1e6, low_open=True))
    max_sim_seconds: float = _knob(
        0.0, "stop the replay at this simulated time (0: no limit)",
        bounds=KnobRange(0.0, 1e9))  # event timestamps are int64 ns: 9.2e9 s at most
    seed: int = _knob(
        0, "seed for every random choice (replays are deterministic per seed)",
        bounds=KnobRange(0, 2**64 - 1))  # the acceptance phase takes it modulo 2**64
    pace: float = _knob(
        0.0, "0: as fast as possible; 1: real time; 2: twice real time",
        bounds=KnobRange(0.0, 1000.0))
    # --- cost model (model; sources in COST_SOURCES.md) ---
    step_overhead_s: float = _knob(
        0.010, "fixed time per iteration (s)",
        bounds=KnobRange(0.0, 3600.0))
    prefill_s_per_token: float = _knob(
        3.1e-5, "time per prefill token (s)",
        bounds=KnobRange(0.0, 1.0))
    decode_s_per_request: float = _knob(
        1.1e-4, "time per decode request per iteration (s)",
        bounds=KnobRange(0.0, 60.0))
    mtp_acceptance_rate: float = _knob(
        0.875, "probability a draft token is accepted (per position)",
        bounds=KnobRange(0.0, 1.0))

    def __post_init__(self) -> None:
        # Coerce enum-typed knobs given as strings (dataclasses.replace passes raw values).
        for name, enum_cls in (("draft_mode", DraftMode), ("draft_cursor_sizing", DraftCursorSizing)):
            value = getattr(self, name)
            if not isinstance(value, enum_cls):
                object.__setattr__(self, name, _coerce_enum(name, enum_cls, value))
        object.__setattr__(self, "engine_version", get_engine_build(self.engine_version).version)
        object.__setattr__(self, "client_max_tokens", str(self.client_max_tokens).strip().lower())
        self._validate()

    # ------------------------------------------------------------------------------------------
    def _validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            # NaN passes every comparison as "not out of range"; a knob is a finite number or nothing.
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value}")
            bounds = f.metadata["bounds"]
            if bounds is not None and not bounds.contains(value):
                raise ValueError(bounds.violation(f.name, value))
        client_max_tokens_cap(self.client_max_tokens)  # raises ValueError on a malformed value
        if self.warmup_concurrency < 0:
            raise ValueError(f"warmup_concurrency must be >= 0, got {self.warmup_concurrency}")
        if self.num_target_blocks == 0 and self.max_gpu_total_bytes == 0:
            raise ValueError("either num_target_blocks or max_gpu_total_bytes must be > 0")
        if self.max_draft_len > 0 and self.num_draft_blocks == 0 and self.max_gpu_total_bytes == 0:
            raise ValueError("with max_draft_len > 0, num_draft_blocks or max_gpu_total_bytes must be > 0")
        if self.max_draft_len > 0 and self.num_draft_blocks == 0 and self.draft_bytes_per_token == 0:
            raise ValueError("with max_draft_len > 0 and a byte budget, draft_bytes_per_token must be > 0")
        if self.max_num_tokens < self.tokens_per_block:
            raise ValueError(
                f"max_num_tokens must be >= tokens_per_block ({self.tokens_per_block}), got {self.max_num_tokens}")
        if not self.enable_chunked_prefill and self.max_num_tokens < self.max_seq_len:
            # Without chunking a prompt must fit one iteration; the real engine requires
            # max_num_tokens >= max_seq_len in that case (otherwise long prompts never schedule).
            raise ValueError("without enable_chunked_prefill, max_num_tokens must be >= max_seq_len")
        if self.draft_mode == DraftMode.PAIRED and self.max_draft_len == 0:
            raise ValueError("draft_mode=paired needs a draft pool: max_draft_len must be > 0")
        if self.defer_draft_resize and not self.engine_build.scheduler_admits_mirror:
            raise ValueError(
                f"defer_draft_resize (PR #19231) builds on the scheduler's mirror admission, which engine_version "
                f"{self.engine_version} does not have; set engine_version={NEWEST.version}")
        if self.draft_mode == DraftMode.PAIRED and not self.engine_build.joint_reuse:
            raise ValueError(
                f"draft_mode=paired needs joint KV cache reuse (#18093), which engine_version "
                f"{self.engine_version} does not have; set engine_version to "
                f"{' or '.join(b.version for b in ENGINE_BUILDS.values() if b.joint_reuse)}, the builds with it "
                f"(e.g. --set engine_version={NEWEST.version})")

    # ------------------------------------------------------------------------------------------
    @property
    def engine_build(self) -> EngineBuild:
        """The feature record of ``engine_version`` (versions.py)."""
        return get_engine_build(self.engine_version)

    @property
    def extra_kv_tokens(self) -> int:
        """``num_extra_kv_tokens``, or the engine's own count when the knob is -1."""
        if self.num_extra_kv_tokens >= 0:
            return self.num_extra_kv_tokens
        return get_num_extra_kv_tokens(self.max_draft_len)

    @property
    def has_draft_pool(self) -> bool:
        """True when MTP runs a separate one-model draft manager (max_draft_len > 0)."""
        return self.max_draft_len > 0

    def pool_blocks(self) -> tuple[int, int]:
        """(target_blocks, draft_blocks): given counts, else the real budget split in tokens -> blocks."""
        target_blocks, draft_blocks = self.num_target_blocks, self.num_draft_blocks
        if self.max_gpu_total_bytes > 0 and (target_blocks == 0 or (self.has_draft_pool and draft_blocks == 0)):
            split = split_kv_cache_budget_for_draft(
                self.max_gpu_total_bytes,
                target_slope=self.target_bytes_per_token, target_intercept=self.target_fixed_bytes,
                draft_slope=self.draft_bytes_per_token if self.has_draft_pool else 0,
                draft_intercept=self.draft_fixed_bytes if self.has_draft_pool else 0)
            target_tokens = (split.target_bytes - self.target_fixed_bytes) // self.target_bytes_per_token
            target_blocks = target_blocks or target_tokens // self.tokens_per_block
            if self.has_draft_pool and draft_blocks == 0:
                draft_tokens = (split.draft_bytes - self.draft_fixed_bytes) // self.draft_bytes_per_token
                draft_blocks = draft_tokens // self.tokens_per_block
        if not self.has_draft_pool:
            draft_blocks = 0
        return target_blocks, draft_blocks

    def index_mapper_capacity(self) -> int:
        """IndexMapper slots: max_batch_size x pp_size + num_reserved_index_slots (not disaggregated)."""
        return self.max_batch_size * self.pp_size + self.num_reserved_index_slots

    # ------------------------------------------------------------------------------------------
    @classmethod
    def knob_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def knob_range(cls, name: str) -> KnobRange | None:
        """The values knob ``name`` accepts (None: a flag, a name or an enum, checked by its type)."""
        return {f.name: f.metadata["bounds"] for f in fields(cls)}[name]

    @classmethod
    def describe_knobs(cls) -> list[tuple[str, str, bool]]:
        """(name, help, is_real_engine_name) for every knob, in declaration order."""
        return [(f.name, f.metadata["help"], f.metadata["real"]) for f in fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def with_overrides(self, pairs: list[str] | tuple[str, ...] | dict[str, Any]) -> EngineConfig:
        """A copy with ``key=value`` overrides applied (values coerced to the knob's type).

        Raises:
            ValueError: unknown key (the message lists the valid ones), malformed pair, or a value
                that does not parse as the knob's type, or a combination that fails validation.
        """
        items = pairs.items() if isinstance(pairs, dict) else (_split_pair(p) for p in pairs)
        by_name = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, raw in items:
            if key not in by_name:
                raise ValueError(_unknown_knob(key, by_name))
            changes[key] = coerce_knob(key, type(getattr(self, key)), raw)
        return dataclasses.replace(self, **changes)


def get_num_extra_kv_tokens(max_draft_len: int) -> int:
    """Extra KV tokens one-engine speculative decoding keeps per request (real
    ``speculative/utils.py::get_num_extra_kv_tokens``): ``max_draft_len - 1`` when the drafter runs
    in the target engine (one-model MTP, Eagle3 one-model, ...; MTP's ``max_draft_len`` is its
    number of next-n layers), 0 without speculation. The shared-KV-cache case (0) is not modelled:
    every scenario has a separate draft manager."""
    return max_draft_len - 1 if max_draft_len > 0 else 0


@dataclass(frozen=True, slots=True)
class BudgetSplit:
    """Result of the target/draft byte-budget split (bytes)."""

    target_bytes: int
    draft_bytes: int


def split_kv_cache_budget_for_draft(
    total_bytes: int, *, target_slope: int, target_intercept: int, draft_slope: int, draft_intercept: int,
) -> BudgetSplit:
    """Split ``max_gpu_total_bytes`` like ``KvCacheCreator._compute_draft_budget_shares``.

    Raises:
        ValueError: the budget does not cover both fixed costs (the real creator raises too, since
            both managers need their fixed state resident on the GPU).
    """
    intercept_total = target_intercept + draft_intercept
    slope_budget = total_bytes - intercept_total
    if slope_budget <= 0:
        raise ValueError(
            f"KV cache GPU budget ({total_bytes / _GIB:.2f} GiB) must exceed the combined fixed cost "
            f"({intercept_total / _GIB:.2f} GiB) of target and draft")
    slope_total = target_slope + draft_slope
    draft_bytes = draft_intercept + int(slope_budget * draft_slope / slope_total)
    return BudgetSplit(target_bytes=total_bytes - draft_bytes, draft_bytes=draft_bytes)


def coerce_knob(name: str, kind: type, raw: Any) -> Any:
    """Parse ``raw`` (usually a string from ``--set``) as ``kind``; ValueError names the knob."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if isinstance(kind, type) and issubclass(kind, Enum):
        return _coerce_enum(name, kind, text)  # its own message lists the values
    words = {bool: "true or false", int: "an integer", float: "a number"}
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            return _parse_int(text)
        if kind is float:
            return float(text)
    except ValueError:
        raise ValueError(f"knob {name!r} expects {kind.__name__} ({words[kind]}), got {raw!r}") from None
    return text


def _parse_int(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        as_float = float(text)  # accepts "6.4e10"; must still be integral
        if not as_float.is_integer():
            raise ValueError("expected an integer") from None
        return int(as_float)


def _coerce_enum(name: str, enum_cls: type[Enum], value: Any) -> Enum:
    try:
        return enum_cls(value)
    except ValueError:
        pass
    if isinstance(value, str):  # values are lower case; PAIRED means paired
        try:
            return enum_cls(value.lower())
        except ValueError:
            pass
    valid = ", ".join(m.value for m in enum_cls)  # type: ignore[attr-defined]
    raise ValueError(f"knob {name!r} must be one of: {valid}; got {value!r}")


def _unknown_knob(key: str, names: Any) -> str:
    """The message for a knob that does not exist: the nearest names, not all of them."""
    nearest = difflib.get_close_matches(key, list(names), n=3, cutoff=0.6)
    if not nearest:  # a prefix or a word of a name (--set batch=...)
        lowered = key.lower()
        nearest = [n for n in sorted(names) if lowered and lowered in n][:3]
    listed = f"{', '.join(nearest)} (the nearest; " if nearest else "none with a similar name ("
    return f"unknown knob {key!r}; valid knobs: {listed}kvscope replay --list-knobs lists all {len(names)})"


def _split_pair(pair: str) -> tuple[str, str]:
    if "=" not in pair:
        raise ValueError(f"--set expects key=value, got {pair!r}")
    key, value = pair.split("=", 1)
    return key.strip(), value


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value
