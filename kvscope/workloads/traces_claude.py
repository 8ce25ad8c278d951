"""Closed-loop replay of the Claude Code agentic sessions in ``kv-cache-tester_traces.tar.xz``.

Size: the archive's reading order and the closed-loop session model depend on each other (which
members are read ahead depends on when sessions start); kept together so that order is visible.

Source: github.com/callanjfox/kv-cache-tester ``traces/trace_NNNN.json`` @ 94f6046d (last change to
``traces/`` c9b3da54), format per ../shared/traces/SOURCES.md: one session per member, 64-token chained
hash ids with ``hash_id_scope == "local"``, ``t``/``think_time``/``api_time`` in seconds, sub-agents as
``type: "subagent"`` entries with nested ``requests`` whose ``t`` is relative to the spawn.

Reading the archive. The ``.tar.xz`` is ONE xz block (461 MB unpacked), so it cannot be seeked:
reading a member out of order would mean decompressing from the start (O(archive) per session).
``_trace_archive.MemberReader`` lists the members once, then keeps one forward traversal open and,
while it passes members on the way to the one a session start needs, keeps those of the next
``archive_window`` sessions; a session start thus parses only its own member, and the archive is
traversed again only about (sessions / archive_window) times per pass (about 1 s each). Memory: the
window's members (about 650 kB of JSON each) plus the active sessions, never the whole archive (all
49k requests' hash ids as Python lists would take ~3.4 GB). Nothing is unpacked to disk.

Sessions. Sessions start in a fixed order: a ``random.Random(seed)`` shuffle of the member names, the
same in every pass. Each start takes a fresh key namespace (trace ids are local to a file), so a
recycled session never reuses its earlier pass's blocks. A parsed session keeps, per chain (main agent
and each sub-agent), every turn's ids delta-encoded against the previous turn of that chain (the
traces are almost pure appends), and decodes one turn at a time when it is released.

Timing (closed loop, see closed_loop.py). Turn j of a chain is released at the finish of turn j-1 plus
its ``think_time`` (when absent: ``t_j - (t_{j-1} + api_time_{j-1})``, floored at 0). A sub-agent's
first turn is released at the finish of the last main-agent turn listed before its spawn entry, plus
the recorded gap ``spawn t + first nested t - (parent t + parent api_time)``, floored at 0. The parent
does not wait for its sub-agents (the recordings show the parent going on while they run). Every
delay is capped by ``max_think_time_s``. The first turn of a session is released when it starts.

``share_system_prefix``: the first ``(tool_tokens + system_tokens) // block_size`` ids of a session's
first main-agent request are taken as the Claude Code tools+system prefix, common to all sessions (the
upstream replayer's "warm prefix"). A request's leading blocks whose ids equal those (chain ids: equal
id means equal prefix) are keyed in the shared namespace by position; the rest stay session-local.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import numpy as np

from ._trace_archive import MemberReader
from ._trace_fields import ids_to_array, int_field, list_field, number_field
from .closed_loop import ClosedLoopSession, ClosedLoopWorkload
from .workload import (
    MAX_NAMESPACE,
    TraceFormatError,
    check_tokens_per_block,
    map_hash_blocks,
    num_uncovered,
)

__all__ = ["MEAN_REQUEST_CYCLE_S", "ClaudeCodeTraceWorkload", "paced_session_start_interval_s"]

MEAN_REQUEST_CYCLE_S = 28.67
"""Mean time between two consecutive main-agent requests of one session in the archive, as the
replay spaces them: the recorded ``api_time`` of the earlier request (mean 9.75 s over the 43,674 of
47,948 gaps that carry it) plus the think time before the later one capped at 60 s (the scenarios'
``think_time_cap_s``; mean 21.53 s). Median 18.0 s. Uncapped the mean is 160.7 s: the long idle gaps
the cap removes. (The per-session rate, p50 0.81 requests/min = 74 s, averages over whole sessions,
idle gaps included, so it is no request cycle.)"""


def paced_session_start_interval_s(requests_in_flight: int, mean_cycle_s: float = MEAN_REQUEST_CYCLE_S) -> float:
    """Session-start spacing that brings the first sessions in at the replay's own arrival pace.

    The archive has no absolute start times (every session starts at its own t=0). With
    ``requests_in_flight`` requests kept outstanding and a mean request cycle ``mean_cycle_s`` the
    loop's arrivals come about ``mean_cycle_s / requests_in_flight`` apart once it runs (glm5-dsa at
    24: 1.19 s; measured in a healthy replay of the same traffic, draft_mode=paired on main-00746ef,
    100-2000 s: 1.25 s on seed 0, 1.37 s on seed 1); starting the first sessions that far apart
    spreads them over one mean cycle instead of releasing them all at t=0.
    """
    if requests_in_flight < 1:
        raise ValueError(f"requests_in_flight must be >= 1, got {requests_in_flight}")
    return mean_cycle_s / requests_in_flight


class _Chain:
    """One agent's turns, ids delta-encoded against the previous turn of the chain."""

    __slots__ = (
        "prompt_len",
        "output_len",
        "think_s",
        "keep",
        "tails",
        "parsed_ids",
        "cur",
        "cur_covered",
        "cur_keys",
        "next_turn",
    )

    def __init__(self) -> None:
        self.prompt_len: list[int] = []
        self.output_len: list[int] = []
        self.think_s: list[float] = []
        self.keep: list[int] = []  # leading ids shared with the previous turn of the chain
        self.tails: list[np.ndarray] = []  # the ids after those
        self.parsed_ids: list = []  # parse time only: the previous turn's raw ids
        self.cur = np.zeros(0, dtype=np.int64)  # decode time: the last released turn's ids
        self.cur_covered = 0  # ... the tokens they cover
        self.cur_keys: tuple[int, ...] = ()  # ... and its block keys
        self.next_turn = 0


class _ClaudeSession(ClosedLoopSession):
    def __init__(
        self,
        session_id: int,
        namespace: int,
        tokens_per_block: int,
        trace_tokens_per_block: int,
        system_ids: np.ndarray | None,
    ) -> None:
        self.session_id = session_id
        self.namespace = namespace
        self.tokens_per_block = tokens_per_block
        self.trace_tokens_per_block = trace_tokens_per_block
        self.system_ids = system_ids
        self.chains: list[_Chain] = []
        self.starts: list[tuple[int, float]] = []
        self.unlocks: dict[int, list[tuple[int, float]]] = {}  # main turn -> sub chains
        self._num_uncovered_keys = 0

    def num_chains(self) -> int:
        return len(self.chains)

    def num_turns(self, chain: int) -> int:
        return len(self.chains[chain].prompt_len)

    def start_delays(self) -> list[tuple[int, float]]:
        return list(self.starts)

    def unlocked_by(self, chain: int, turn: int) -> list[tuple[int, float]]:
        return self.unlocks.get(turn, []) if chain == 0 else []

    def think_s(self, chain: int, turn: int) -> float:
        return self.chains[chain].think_s[turn]

    def build_request(self, chain: int, turn: int) -> tuple[int, int, tuple[int, ...]]:
        ch = self.chains[chain]
        if turn != ch.next_turn:
            raise RuntimeError(f"turn {turn} of chain {chain} decoded out of order")
        keep = ch.keep[turn]
        ids = np.concatenate((ch.cur[:keep], ch.tails[turn]))
        prompt_len = ch.prompt_len[turn]
        tpb = self.tokens_per_block
        covered = min(len(ids) * self.trace_tokens_per_block, prompt_len)
        shared = 0
        if self.system_ids is not None and len(self.system_ids):
            n = min(len(self.system_ids), len(ids))
            eq = ids[:n] == self.system_ids[:n]
            shared = n if bool(eq.all()) else int(np.argmin(eq))
        # Engine blocks that end inside the ids kept from the previous turn keep their keys (their
        # ids and shared status are unchanged): only the appended blocks are derived.
        num_kept = min(keep * self.trace_tokens_per_block, ch.cur_covered, covered) // tpb
        keys = ch.cur_keys[:num_kept] + map_hash_blocks(
            ids,
            prompt_len=prompt_len,
            trace_tokens_per_block=self.trace_tokens_per_block,
            tokens_per_block=tpb,
            namespace=self.namespace,
            covered_tokens=covered,
            num_shared_trace_blocks=shared,
            first_uncovered_id=self._num_uncovered_keys,
            first_block=num_kept,
        )
        self._num_uncovered_keys += num_uncovered(prompt_len, tpb, covered)
        ch.cur, ch.cur_covered, ch.cur_keys = ids, covered, keys
        ch.next_turn += 1
        if ch.next_turn == len(ch.prompt_len):  # chain done: drop its decode state
            ch.cur, ch.cur_keys = ch.cur[:0], ()
        return prompt_len, max(1, ch.output_len[turn]), keys


def _add_turn(
    chain: _Chain,
    ids: list,
    prompt_len: int,
    output_len: int,
    think: float,
    where: tuple[str, str],
) -> np.ndarray:
    """Append a turn, its ids delta-encoded against the chain's previous turn; returns its tail."""
    path, loc = where
    prev = chain.parsed_ids
    num_prev = len(prev)
    if len(ids) >= num_prev and ids[:num_prev] == prev:  # pure append: the common case
        keep = num_prev
        tail = ids_to_array(path, loc, "hash_ids", ids[keep:], keep)
    else:  # a reset (e.g. context compaction): find where the ids part
        arr = ids_to_array(path, loc, "hash_ids", ids)
        n = min(num_prev, len(arr))
        diff = np.flatnonzero(np.asarray(prev[:n], dtype=np.int64) != arr[:n])
        keep = int(diff[0]) if len(diff) else n
        tail = arr[keep:]
    chain.parsed_ids = ids
    chain.keep.append(keep)
    chain.tails.append(tail.astype(np.int32))
    chain.prompt_len.append(prompt_len)
    chain.output_len.append(output_len)
    chain.think_s.append(think)
    return tail


def _parse_llm(
    path: str, loc: str, req: dict
) -> tuple[float, int, int, list, float | None, float | None]:
    t = number_field(path, loc, req, "t")
    prompt_len = int_field(path, loc, req, "in", minimum=1)
    output_len = int_field(path, loc, req, "out", minimum=0)
    ids = list_field(path, loc, req, "hash_ids")
    think = number_field(path, loc, req, "think_time", optional=True)
    api = number_field(path, loc, req, "api_time", optional=True)
    return t, prompt_len, output_len, ids, think, api


def _parse_session(
    path: str,
    member: str,
    data: bytes,
    session_id: int,
    namespace: int,
    tokens_per_block: int,
    share_system_prefix: bool,
) -> _ClaudeSession:
    where = f"member {member}"
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise TraceFormatError(path, where, "<json>", f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise TraceFormatError(path, where, "<json>", "top level must be an object")
    block = int_field(path, where, doc, "block_size", minimum=1)
    check_tokens_per_block(tokens_per_block, block)
    scope = doc.get("hash_id_scope", "local")
    if scope != "local":
        raise TraceFormatError(path, where, "hash_id_scope", f"must be 'local', got {scope!r}")
    prefix_tokens = int_field(path, where, doc, "tool_tokens", minimum=0) + int_field(
        path, where, doc, "system_tokens", minimum=0
    )
    requests = list_field(path, where, doc, "requests")
    session = _ClaudeSession(session_id, namespace, tokens_per_block, block, None)
    main = _Chain()
    session.chains.append(main)
    prev: tuple[float, float | None] | None = None  # (t, api_time) of the previous main turn
    for i, req in enumerate(requests):
        loc = f"{where} requests[{i}]"
        if not isinstance(req, dict):
            raise TraceFormatError(path, loc, "<request>", "must be an object")
        if req.get("type") == "subagent":
            spawn_t = number_field(path, loc, req, "t")
            nested = list_field(path, loc, req, "requests")
            sub = _Chain()
            sub_prev: tuple[float, float | None] | None = None
            first_t = 0.0
            for k, sreq in enumerate(nested):
                sloc = f"{loc}.requests[{k}]"
                if not isinstance(sreq, dict) or sreq.get("type") == "subagent":
                    raise TraceFormatError(path, sloc, "type", "must be an LLM request object")
                t, p, o, ids, think, api = _parse_llm(path, sloc, sreq)
                if sub_prev is None:
                    first_t = t
                _add_turn(sub, ids, p, o, _think(t, think, sub_prev), (path, sloc))
                sub_prev = (t, api)
            if not sub.prompt_len:
                continue
            sub.parsed_ids = []
            chain_index = len(session.chains)
            session.chains.append(sub)
            parent_turn = len(main.prompt_len) - 1
            if parent_turn < 0:
                session.starts.append((chain_index, max(0.0, spawn_t + first_t)))
            else:
                assert prev is not None
                parent_end = prev[0] + (prev[1] or 0.0)
                delay = max(0.0, spawn_t + first_t - parent_end)
                session.unlocks.setdefault(parent_turn, []).append((chain_index, delay))
            continue
        t, p, o, ids, think, api = _parse_llm(path, loc, req)
        is_first = not main.prompt_len
        tail = _add_turn(main, ids, p, o, _think(t, think, prev), (path, loc))
        if is_first and share_system_prefix:
            session.system_ids = tail[: prefix_tokens // block].copy()
        prev = (t, api)
    if not main.prompt_len:
        raise TraceFormatError(path, where, "requests", "holds no main-agent LLM request")
    main.parsed_ids = []
    session.starts.insert(0, (0, 0.0))
    return session


def _think(t: float, think: float | None, prev: tuple[float, float | None] | None) -> float:
    if prev is None:
        return 0.0
    if think is not None:
        return max(0.0, think)
    prev_t, prev_api = prev
    return max(0.0, t - (prev_t + prev_api)) if prev_api is not None else 0.0


class ClaudeCodeTraceWorkload(ClosedLoopWorkload):
    """Closed-loop replay of the Claude Code sessions (see module docstring).

    Args:
        tokens_per_block: the engine's tokens per block.
        seed: fixes the session order (a shuffle of the members).
        path: the ``kv-cache-tester_traces.tar.xz`` archive.
        requests_in_flight: about this many requests outstanding (>= 1; the report's 16-32).
        max_think_time_s: cap on think times and sub-agent spawn gaps (None: as recorded).
        share_system_prefix: key the tools+system prefix blocks across sessions (see module doc).
        max_requests: stop after releasing this many requests (None: no limit).
        max_sessions: stop after starting this many sessions, recycled ones included (None: no limit).
        recycle: start the archive again under fresh namespaces once every session has started.
        end_session_on_failure: a failed/rejected request ends its session.
        archive_window: members kept ahead of the session order while traversing the archive
            (>= 1): larger = fewer traversals, more memory (about 650 kB per member).
        session_start_interval_s: least time between two session starts (``closed_loop.py``).
    """

    def __init__(
        self,
        tokens_per_block: int,
        seed: int = 0,
        *,
        path: str,
        requests_in_flight: int = 24,
        max_think_time_s: float | None = None,
        share_system_prefix: bool = False,
        max_requests: int | None = None,
        max_sessions: int | None = None,
        recycle: bool = True,
        end_session_on_failure: bool = False,
        archive_window: int = 128,
        session_start_interval_s: float = 0.0,
    ) -> None:
        check_tokens_per_block(tokens_per_block)
        super().__init__(
            tokens_per_block,
            requests_in_flight=requests_in_flight,
            max_think_time_s=max_think_time_s,
            max_requests=max_requests,
            end_session_on_failure=end_session_on_failure,
            session_start_interval_s=session_start_interval_s,
        )
        if max_sessions is not None and max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1 or None, got {max_sessions}")
        if isinstance(archive_window, bool) or not isinstance(archive_window, int):
            raise ValueError(f"archive_window must be an int, got {archive_window!r}")
        if archive_window < 1:
            raise ValueError(f"archive_window must be >= 1, got {archive_window}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"trace archive not found: {path}")
        self.seed = seed
        self.path = str(path)
        self.share_system_prefix = bool(share_system_prefix)
        self.max_sessions = max_sessions
        self.recycle = bool(recycle)
        self.archive_window = archive_window
        self._archive = MemberReader(self.path)
        self._order: list[str] | None = None
        self._position: dict[str, int] = {}

    @property
    def num_members_stored(self) -> int:
        """Members held ahead of the session order."""
        return self._archive.num_stored

    @property
    def num_archive_scans(self) -> int:
        """Traversals of the archive so far (the listing one included)."""
        return self._archive.num_traversals

    def session_order(self) -> list[str]:
        """Member names in the order sessions start (same in every pass)."""
        return list(self._session_order())

    def _session_order(self) -> list[str]:
        if self._order is None:
            order = list(self._archive.names())
            random.Random(self.seed).shuffle(order)
            self._order = order
            self._position = {name: i for i, name in enumerate(order)}
        return self._order

    def _next_session(self) -> ClosedLoopSession | None:
        index = self.num_sessions_started
        if self.max_sessions is not None and index >= self.max_sessions:
            return None
        order = self._session_order()
        num = len(order)
        if index >= num and not self.recycle:
            return None
        namespace = index + 1
        if namespace > MAX_NAMESPACE:
            raise ValueError(f"key namespaces exhausted: at most {MAX_NAMESPACE} session starts")
        pos = index % num
        limit = self.max_sessions if self.max_sessions is not None else float("inf")
        if not self.recycle:
            limit = min(limit, num)

        def keep(member: str) -> bool:
            # the next archive_window sessions of the (cyclic) order that will still start
            ahead = (self._position[member] - pos) % num
            return 0 < ahead < self.archive_window and index + ahead < limit

        name = order[pos]
        return _parse_session(
            self.path,
            name,
            self._archive.take(name, keep),
            index,
            namespace,
            self.tokens_per_block,
            self.share_system_prefix,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "workload": "claude-code-trace",
            "path": self.path,
            "tokens_per_block": self.tokens_per_block,
            "seed": self.seed,
            "requests_in_flight": self.requests_in_flight,
            "max_think_time_s": self.max_think_time_s,
            "share_system_prefix": self.share_system_prefix,
            "max_requests": self.max_requests,
            "max_sessions": self.max_sessions,
            "recycle": self.recycle,
            "end_session_on_failure": self.end_session_on_failure,
            "archive_window": self.archive_window,
            "session_start_interval_s": self.session_start_interval_s,
        }
