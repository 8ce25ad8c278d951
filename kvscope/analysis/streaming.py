"""StreamingAnalyzer: the detectors run incrementally on a live event stream, with bounded memory.

``feed(events)`` takes KVEvent objects or canonical rows (FIELDS order), updates per-request and
per-pool state, and returns the findings *raised* by these events (an episode is raised once, when
it starts; its end time and named requests keep updating in :attr:`findings`). Gauges
(:meth:`draft_debt_blocks`, :meth:`time_to_exhaustion_s`) are readable at any time, e.g. by the OTel
metrics callbacks or the dashboard. Memory: live requests, one window of iterations per pool and at
most ``max_findings`` findings; finished requests are dropped at once.

The rules are the batch analyzer's: both run the table :data:`kvscope.analysis.rules.RULES`. Every
rule's tracker is built from the table and fed through the hooks it has
(:class:`~kvscope.analysis.rules.context.Tracker`: the rows it asks for, a live request's rows,
consistent points, iteration ends, the end of the stream), reading the per-request and per-pool
state this analyzer keeps (:class:`~kvscope.analysis.rules.context.LiveContext`); this module names
no rule. A test feeds the same stream to both analyzers and compares. A summary (reuse loss) is
raised at :meth:`close`.

Size: one consumer loop keeps the per-request, per-pool and per-iteration state every rule reads
(the rules share it row by row, through :class:`~kvscope.analysis.rules.context.LiveContext`);
what needs no shared state lives apart (live_request.py, live_projections.py,
kvscope.analysis.findings_log, kvscope.analysis.rules).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, order_findings
from kvscope.analysis.findings_log import FindingsLog
from kvscope.analysis.incidents import (
    EXHAUSTION_KINDS,
    alarm_intervals,
    alarm_level,
)
from kvscope.analysis.live_projections import (
    arrival_debt,
    arrival_debt_bound,
    ceiling_risk,
    head_debt,
    queue_now_debt,
)
from kvscope.analysis.live_request import _Req
from kvscope.analysis.pool_config import config_row
from kvscope.analysis.rules import KIND_RANK, RULES
from kvscope.analysis.rules.context import ExhaustionReading, LiveContext, Tracker
from kvscope.events import (
    REQUEST_OUTCOMES,
    EventKind,
    KVEvent,
    PoolRole,
    blocks_needed,
    parse_kv,
)

_KV = (PoolRole.TARGET.value, PoolRole.DRAFT.value)
_END = {k.value: outcome for k, outcome in REQUEST_OUTCOMES.items()}  # rows carry kind values
# Plain strings: an enum member's ``.value`` is a property call, and these are read per event.
_TGT, _DRAFT, _NONE = PoolRole.TARGET.value, PoolRole.DRAFT.value, PoolRole.NONE.value
_ARRIVED, _ADMITTED = EventKind.REQUEST_ARRIVED.value, EventKind.ADMITTED.value
_DEFERRED, _REJECTED = EventKind.ADMISSION_DEFERRED.value, EventKind.ADMISSION_REJECTED.value
_CHUNK, _ITER = EventKind.CONTEXT_CHUNK_SCHEDULED.value, EventKind.ITERATION_SCHEDULED.value
_GROWS = {EventKind.BLOCKS_ALLOCATED.value, EventKind.RESIZED.value}
_FREED, _REUSED = EventKind.BLOCKS_FREED.value, EventKind.BLOCKS_REUSED.value
_SUSPENDED, _RESUMED = EventKind.SUSPENDED.value, EventKind.RESUMED.value
_CONFIGURED, _SNAPSHOT = EventKind.POOL_CONFIGURED.value, EventKind.POOL_SNAPSHOT.value
_MODE, _FAILED = EventKind.REMEDIATION_MODE_CHANGED.value, EventKind.ENGINE_FAILED.value


def _hooks_of(trackers: list[Tracker], name: str) -> list:
    """The trackers' bound ``name`` methods, for those that have one (an optional hook)."""
    return [h for h in (getattr(t, name, None) for t in trackers) if h is not None]


def _div(a: float, b: float) -> float:
    """a / b with numpy's conventions (x/0 = inf, 0/0 = nan, nan stays nan)."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a)
    return a / b


class StreamingAnalyzer:
    """Incremental detectors over a live event stream (single consumer thread; not thread-safe).

    Args:
        config: detector thresholds (shared with the batch analyzer).
        max_findings: most findings kept (oldest dropped first, counted in ``dropped_findings``).
    """

    def __init__(
        self, config: DetectorConfig | None = None, *, max_findings: int = 1000, hit_window: int = 16
    ) -> None:
        if max_findings < 1:
            raise ValueError(f"max_findings must be >= 1, got {max_findings}")
        self.cfg = config or DetectorConfig()
        self.max_findings = max_findings
        # The state the rules read (their trackers get it with every hook); the analyzer keeps it
        # in place through the aliases below, never rebinding a container.
        self._log = FindingsLog(max_findings)  # the findings of the rules that share this state
        self._live = LiveContext(max_findings=max_findings, log=self._log, need={p: 0.0 for p in _KV},
                                 kind_rank=KIND_RANK)
        self._configs: dict[str, dict] = self._live.configs
        self._state: dict[str, tuple[float, float]] = self._live.state  # pool -> (capacity, available)
        self._reqs: dict[int, _Req] = self._live.reqs
        self._need: dict[str, float] = self._live.need
        self._queued: dict[str, float] = {p: 0.0 for p in _KV}
        # The queue at the current hit rate (queue._at_current_rate): per pool that gets the target's
        # reuse, total and prompt tokens of the requests whose own match is not seen, blocks of those
        # whose match is.
        self._q_rate: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in _KV}
        self._decode: dict[str, float] = {p: 0.0 for p in _KV}  # held by decoding requests
        self._recent: deque[tuple[float, float]] = deque(maxlen=hit_window)  # (reused, prompt) per admission
        self._alloc_iter: dict[str, float] = {p: 0.0 for p in _KV}
        self._cum_alloc: dict[str, float] = {p: 0.0 for p in _KV}
        self._new_iter: dict[str, float] = {p: 0.0 for p in _KV}  # taken by first growths this iteration
        self._new_window: dict[str, deque] = {}  # per iteration, over burst/rate_window_iterations
        self._gate_held: dict[str, int] = {}  # iterations in a row the mirror's admission gate rule has held
        self._window: dict[str, deque] = self._live.window
        self._freed_window: dict[str, deque] = {}  # blocks freed up to each iteration end, free_window_iterations
        self._budget = math.nan  # most tokens one iteration scheduled (ceiling.budget_iterations)
        self._stride = math.inf  # fewest iterations between two chunks of one request (finishes.py)
        self._max_chunk = math.nan  # largest context chunk (debt.largest_chunk)
        self._arrivals_now: list[tuple[int, int]] = self._live.arrivals_now  # (request, iteration) arrived this iteration
        self._eta: dict[str, tuple[float, float, str]] = {}
        self._iteration: int | None = None
        self._last_t = 0.0
        self._last_it = -1
        self._iter_admitted: list[int] = self._live.iter_admitted  # admissions of the current iteration
        self._ended: deque[int] = deque(maxlen=4096)  # recently ended ids, bounded
        self._ended_set: set[int] = set()
        self._live_target: int | None = None  # live caches at the target's last snapshot
        self._guarded = False  # an admission policy (remediation) is enforcing
        self._recent_admissions: deque[tuple[float, float]] = deque(maxlen=hit_window)  # (prompt, reuse)
        # Derived from the configs (refreshed by _configured), so per-event paths do not rebuild them.
        self._cfg_gen = 0
        self._outside_pools: list[str] = self._live.outside_pools
        self._kv_cfgs: list[tuple[str, dict]] = []
        self._kv_cfg_of: dict[str, list[tuple[str, dict]]] = {}
        self._arrival_finals: dict | None = None
        self._ready_pools: set[str] = set()  # pools the projections can read (live_projections._ready)
        self._seq = 0  # first-seen order of requests (_reqs' insertion order)
        self._queue: dict[int, _Req] = {}  # the queued requests
        self._queue_in_order = True  # _queue's insertion order is first-seen order
        self._queue_last_seq = 0
        self._trackers: list[Tracker] = [r.tracker(self.cfg) for r in RULES]
        self._live.trackers[:] = self._trackers
        self._hooks: dict[str, tuple] = {}  # row kind -> the on_row of the trackers that read it now
        self._subscribe()
        # The trackers' optional hooks (kvscope.analysis.rules.context.Tracker).
        req_hooks: dict[str, list] = {}
        for tracker in self._trackers:
            for k in getattr(tracker, "request_kinds", ()):
                req_hooks.setdefault(k, []).append(tracker.on_request)  # type: ignore[attr-defined]
        self._req_hooks = {k: tuple(v) for k, v in req_hooks.items()}  # row kind -> on_request hooks
        self._end_hooks = tuple(_hooks_of(self._trackers, "on_iteration_end"))
        self._point_hooks = tuple(_hooks_of(self._trackers, "on_consistent_point"))
        self._close_hooks = tuple(_hooks_of(self._trackers, "close"))
        self._new_hooks = tuple(_hooks_of(self._trackers, "new_findings"))
        self._bounded = [t for t in self._trackers if hasattr(t, "dropped")]
        self._tracked_raised: list[Finding] = []  # findings the trackers' row hooks raised in the current feed
        self._levels: dict[str, tuple[int, bool]] = {}  # _alarms' answers for the current state
        self._levels_key: tuple | None = None
        self._levels_since = -math.inf

    # ---- public API ------------------------------------------------------------------------
    @property
    def findings(self) -> list[Finding]:
        """Every finding raised so far, with end times and names updated, in the batch order
        (:func:`order_findings`); the trackers' as they keep them (stalls as incidents)."""
        return order_findings(self._live.held_findings())

    @property
    def dropped_findings(self) -> int:
        """Findings dropped for ``max_findings`` (oldest first), the trackers' included."""
        return self._log.dropped + sum(t.dropped for t in self._bounded)  # type: ignore[attr-defined]

    def draft_debt_blocks(self, pool: str = PoolRole.DRAFT.value) -> float:
        """Current debt of ``pool`` in its blocks (NaN until the pool's state was seen)."""
        return self._live.debt(str(getattr(pool, "value", pool)))

    def time_to_exhaustion_s(self, pool: str = PoolRole.DRAFT.value) -> float:
        """Latest time-to-exhaustion estimate in seconds (inf: no exhaustion in sight)."""
        return self._eta.get(str(getattr(pool, "value", pool)), (math.inf, math.inf, ""))[0]

    def alarm_level(self, pool: str = PoolRole.DRAFT.value) -> int:
        """The highest alarm level on ``pool`` (:func:`~kvscope.analysis.incidents.alarm_intervals`:
        0 none, 1 warning, 2 critical) in force since the previous call (since the stream began on
        the first): what the live export sets the ``alarm_level`` gauge to after each batch, as the
        file export does every metric interval. Calls between two feeds agree."""
        return self._alarms(pool)[0]

    def exhaustion_risk(self, pool: str = PoolRole.DRAFT.value) -> bool:
        """Whether a finding that says ``pool`` is running out (:data:`~kvscope.analysis.incidents.
        EXHAUSTION_KINDS`) was in force over the same span as :meth:`alarm_level`'s: the live export
        sets a time to exhaustion only then, as the file export does."""
        return self._alarms(pool)[1]

    def _alarms(self, pool: str) -> tuple[int, bool]:
        p = str(getattr(pool, "value", pool))
        key = (self._last_t, self._last_it, len(self._log.items), self.dropped_findings)
        if self._levels_key != key:
            findings = self.findings
            since, self._levels_since = self._levels_since, self._last_t
            now = self._last_t
            warn_s = self.cfg.stall_warn_s
            self._levels = {q: (alarm_level(alarm_intervals(findings, q, stall_warn_s=warn_s), since, now),
                                alarm_level(alarm_intervals(findings, q, kinds=EXHAUSTION_KINDS), since, now) > 0)
                            for q in _KV}
            self._levels_key = key
        return self._levels.get(p, (0, False))

    def gauges(self) -> dict[str, dict[str, float]]:
        return {p: {"debt_blocks": self._live.debt(p), "projected_debt_blocks": self._projected(p),
                    "eta_s": self.time_to_exhaustion_s(p),
                    "need_blocks": self._need.get(p, 0.0),
                    "available_blocks": self._state.get(p, (math.nan, math.nan))[1]}
                for p in self._configs if p in _KV}

    def feed(self, events: Iterable[KVEvent | tuple]) -> list[Finding]:
        """Consume events in recording order; return the findings raised by them, then those
        raised earlier as warnings that they turned critical (again, as they stand now: a live
        log of findings says when a warning became a page, and why)."""
        before = self._log.next_handle
        for e in events:
            row = e.as_row() if isinstance(e, KVEvent) else e
            self._one(row)
        return self._raised(before)

    def feed_raw(self, raws: Iterable[tuple]) -> list[Finding]:
        """:meth:`feed` for the recorder's raw rows (``RAW_FIELDS`` order, as the live stream
        carries them), without building canonical rows first (the rules read neither rank nor pid)."""
        before = self._log.next_handle
        one = self._one
        for r in raws:
            one(r, True)
        return self._raised(before)

    def _raised(self, before: int) -> list[Finding]:
        # The log's own count, never dropped_findings: that also counts the stall tracker's waits,
        # which it drops and takes back every iteration end while more requests wait than it keeps,
        # and each of those counts made an old finding of the log read as raised again.
        first_new = self._log.position_of(before)
        tracked, self._tracked_raised = self._tracked_raised, []
        return (self._log.items[first_new:] + self._log.take_turned(first_new) + self._new_findings()
                + tracked)

    def _new_findings(self) -> list[Finding]:
        """What the trackers raised outside their row hooks since the last feed."""
        return [f for new in self._new_hooks for f in new()]

    def close(self) -> list[Finding]:
        """End of stream: finish the last iteration; the trackers close their open findings and add
        their summaries (reuse loss)."""
        before = self._log.next_handle
        if self._iteration is not None:
            self._end_iteration()
        t, it = self._last_t, self._last_it
        for close in self._close_hooks:
            close(t, it, self._live)
        first_new = self._log.position_of(before)  # a full log drops its oldest as it takes new ones
        return self._log.items[first_new:] + self._log.take_turned(first_new) + self._new_findings()

    # ---- per event --------------------------------------------------------------------------
    def _one(self, row: tuple, raw: bool = False) -> None:
        if raw:  # a raw ring row, kvscope.events.schema.RAW_FIELDS order (sequence number, no rank / pid)
            _seq, ts, it, rid, pool, kind, nb, nt, _nr, cap, free, evict, _res, reason = row[:14]
        else:  # a canonical row, kvscope.events.FIELDS order (COL_* in events/schema.py)
            ts, it, _rank, _pid, rid, pool, kind, nb, nt, _nr, cap, free, evict, _res, reason = row[:15]
        if kind.__class__ is not str:  # an enum member: its value without the property call
            kind = getattr(kind, "_value_", kind)
        if pool.__class__ is not str:
            pool = getattr(pool, "_value_", pool)
        t = ts / 1e9
        if it != self._iteration and self._iteration is not None:
            self._end_iteration()
            self._iter_admitted.clear()
        self._iteration, self._last_t, self._last_it = it, t, it
        if kind == _CONFIGURED:
            d = parse_kv(reason or "")
            d.setdefault("tokens_per_block", nt)
            self._configs[pool] = config_row(pool, d, capacity=cap, bytes_per_token=nb, slots=_nr)
            self._window.setdefault(pool, deque(maxlen=self.cfg.rate_window_iterations + 1))
            self._configured()
        hooks = self._hooks.get(kind)
        if hooks is not None:  # the rules with trackers of their own (kvscope.analysis.rules)
            self._live.row_reserved = _res
            for on_row in hooks:
                f = on_row(kind, pool, rid, t, it, nb, nt, _nr, cap, free, evict, reason, self._live)
                if f is not None:
                    self._tracked_raised.append(f)
            if kind == _CONFIGURED:
                self._subscribe()
        if cap >= 0 and pool != _NONE:
            self._state[pool] = (float(cap), float(max(free, 0) + max(evict, 0)))
        if kind == _SNAPSHOT:
            if pool == _TGT:
                self._live_target = int(_nr)
        elif kind == _MODE:
            self._guarded = bool(parse_kv(reason or "").get("enforcing", 0))
        elif kind == _FAILED:
            if rid >= 0:
                self._request_event(rid, kind, pool, nb, nt, t, it, reason)
            return
        elif kind == _ITER:
            if not nt <= self._budget:  # NaN before the first
                self._budget = self._live.budget_tokens = float(nt)
            if rid >= 0:
                self._request_event(rid, kind, pool, nb, nt, t, it, reason)
            for on_point in self._point_hooks:
                on_point(t, it, self._live)
            return
        if rid >= 0:
            self._request_event(rid, kind, pool, nb, nt, t, it, reason)
            if kind == _ADMITTED:
                self._iter_admitted.append(rid)

    def _subscribe(self) -> None:
        """Route each row kind to the trackers that read it now (:attr:`Tracker.row_kinds`)."""
        hooks: dict[str, list] = {}
        for tracker in self._trackers:
            for k in tracker.row_kinds:
                hooks.setdefault(k, []).append(tracker.on_row)
        self._hooks = {k: tuple(v) for k, v in hooks.items()}

    def _configured(self) -> None:
        """A pool was configured: refresh what the per-event paths precompute from the configs."""
        self._cfg_gen += 1
        self._outside_pools[:] = [p for p, c in self._configs.items() if p in _KV and not c["in_admission"]]
        self._kv_cfgs = [(p, c) for p, c in self._configs.items() if p in _KV]
        self._kv_cfg_of = {p: [(p, c)] for p, c in self._kv_cfgs}
        self._arrival_finals = None
        # A recording may hold arrivals before the pools' configurations (a live engine's workload
        # is read before its KV managers are built): what was left uncounted for want of a config
        # is counted now, as the batch analyzer, which sees the whole file, counts it.
        for req in self._reqs.values():
            if req.prompt >= 0 and req.queued:
                self._set_queued(req, req.queued_reuse, known=req.reuse_known)

    def _request_event(self, rid: int, kind: str, pool: str, nb: int, nt: int, t: float, it: int, reason: str) -> None:
        req = self._reqs.get(rid)
        if req is None:
            if kind in _END or rid in self._ended_set:
                return  # late events of an ended request (e.g. BLOCKS_FREED after REQUEST_FINISHED)
            self._seq += 1
            req = self._reqs[rid] = _Req(rid, seq=self._seq)
        scope: str | tuple | None = None  # pools whose inputs this event changes (None: every pool)
        if kind == _ARRIVED:
            req.prompt, req.arrival_s, req.arrival_it, req.max_new = nt, t, it, nb
            self._arrivals_now.append((rid, it))
            self._enqueue(req)
            self._set_queued(req, self._hit_rate() * nt)
        elif kind == _ADMITTED:
            req.counted, req.target_reuse, req.context_done = True, float(nt), False
            if math.isnan(req.admitted_s):
                req.admitted_s, req.admitted_it = t, it
                self._recent.append((float(nt), float(max(req.prompt, 0))))
                self._recent_admissions.append((float(max(req.prompt, 0)), float(nt)))
                self._arrival_finals = None
            self._unqueue(req)
        elif kind == _CHUNK:
            if req.prompt >= 0 and nb + nt >= req.prompt:  # position before + chunk reaches the end
                req.context_done = True
            if req.chunk_it >= 0 and it - req.chunk_it < self._stride:
                self._stride = it - req.chunk_it  # see kvscope.analysis.finishes.chunk_stride
            if not nt <= self._max_chunk:  # NaN before the first
                self._max_chunk = float(nt)
            req.chunk_end, req.chunk, req.chunk_it = float(nb + nt), float(nt), it
        # The events below change one pool's inputs of the request's held and still-needed blocks
        # (scope: that pool); any other event not above changes none (scope: ()).
        elif kind in _GROWS:
            scope = ()
            if pool in _KV:
                req.cap[pool] = float(nt)
                scope = pool
        elif kind == _FREED:
            scope = ()
            if pool in _KV:
                req.cap[pool] = 0.0
                scope = pool
                if pool == _TGT:
                    req.counted = False
                    scope = None
        elif kind == _SUSPENDED or kind == _RESUMED:
            scope = ()
            if pool in _KV:
                req.susp[pool] = kind == _SUSPENDED
                scope = pool
        elif kind == _REUSED:
            scope = ()
            if pool in _KV:
                req.reused[pool] = float(nt)
                scope = pool
                if req.queued and pool == _TGT:
                    self._set_queued(req, float(nt), known=True)
        elif kind not in _END:
            scope = ()
        hooks = self._req_hooks.get(kind)
        if hooks is not None:  # the trackers that read a live request's rows (kvscope.analysis.rules)
            for on_request in hooks:
                on_request(req, kind, pool, t, it, reason, self._live)
        if kind in _END:
            req.counted = False
            self._unqueue(req)
            self._update_rem(rid, req)
            del self._reqs[rid]
            if len(self._ended) == self._ended.maxlen:
                self._ended_set.discard(self._ended[0])
            self._ended.append(rid)
            self._ended_set.add(rid)
        else:
            self._update_rem(rid, req, scope)

    def _update_rem(self, rid: int, req: _Req, scope: str | tuple | None = None) -> None:
        """Bring the request's held / still-needed / decoding blocks up to date in the pools of
        ``scope`` (None: all). The figures are a function of the request's fields and the configs,
        so pools whose inputs did not change since the last update keep their values."""
        counted, done = req.counted, req.context_done
        finals = req.finals
        cfgs = self._kv_cfgs
        if finals is None or finals[0] != self._cfg_gen or finals[1] != req.prompt:
            finals = req.finals = (self._cfg_gen, req.prompt, {
                p: blocks_needed(req.prompt, c["tokens_per_block"], max_draft_len=c["max_draft_len"],
                                 num_extra_kv_tokens=c["num_extra_kv_tokens"])
                for p, c in self._kv_cfgs} if req.prompt >= 0 else None)
        elif scope is not None:  # (configs unchanged since the last update: finals are current)
            cfgs = self._kv_cfg_of.get(scope, ()) if scope else ()
        fin = finals[2]
        for p, c in cfgs:
            tpb = c["tokens_per_block"]
            reused = req.reused.get(p, 0.0)
            if p == _TGT or c["paired"]:
                reused = max(reused, req.target_reuse)
            # Suspended pages stay HELD unless a host tier takes them (see kvscope.analysis.debt).
            frees = req.susp.get(p) and c["num_host_blocks"] > 0
            held_tok = 0.0 if frees else max(req.cap.get(p, 0.0), reused)
            held = math.ceil(held_tok / tpb)
            dec = held if (counted and done) else 0
            old = req.dec.get(p, 0)
            if dec != old:
                self._decode[p] += dec - old
                req.dec[p] = dec
            final = fin[p] if fin is not None else held
            rem = max(final - held, 0) if counted else 0
            old = req.rem.get(p, 0)
            if rem != old:
                self._need[p] += rem - old
                req.rem[p] = rem
            prev_held = req.held.get(p, 0)
            if not frees and held > prev_held:
                self._alloc_iter[p] += held - prev_held
                if p not in req.grown:  # its first pages here: a new mirror takes its prompt at once
                    req.grown += (p,)
                    self._new_iter[p] += held - prev_held
            req.held[p] = held

    def _set_queued(self, req: _Req, target_reuse_est: float, *, known: bool = False) -> None:
        req.queued_reuse, req.reuse_known = target_reuse_est, known
        for p, c in self._kv_cfgs:
            if req.prompt < 0:
                continue
            uses_reuse = p == _TGT or c["paired"]
            q = blocks_needed(req.prompt, c["tokens_per_block"], max_draft_len=c["max_draft_len"],
                              num_extra_kv_tokens=c["num_extra_kv_tokens"],
                              reused_tokens=target_reuse_est if uses_reuse else 0.0)
            self._queued[p] += q - req.q.get(p, 0)
            req.q[p] = q
            if uses_reuse:
                part = (0.0, 0.0, float(q)) if known else (
                    float(req.prompt + c["max_draft_len"] + c["num_extra_kv_tokens"]), float(req.prompt), 0.0)
                self._add_rate_part(p, req.q_rate.get(p), -1.0)
                self._add_rate_part(p, part, 1.0)
                req.q_rate[p] = part

    def _add_rate_part(self, p: str, part: tuple[float, float, float] | None, sign: float) -> None:
        if part is not None:
            acc = self._q_rate[p]
            acc[0] += sign * part[0]
            acc[1] += sign * part[1]
            acc[2] += sign * part[2]

    def queued_blocks(self, p: str) -> float:
        """What the queued requests would need in pool ``p``: as counted at their arrival (the hit
        rate then, or their own match), and at least, where the pool gets the target's reuse, what
        the hit rate over the last admissions gives now (the batch form:
        :func:`kvscope.analysis.queue.queued_need`)."""
        q = self._queued.get(p, 0.0)
        c = self._configs.get(p)
        if c is None or not (p == _TGT or c["paired"]):
            return q
        total, prompt, known = self._q_rate[p]
        return max(q, known + max(total - self._hit_rate() * prompt, 0.0) / c["tokens_per_block"])

    def _hit_rate(self) -> float:
        """The target's hit rate over the last ``hit_window`` admissions (0 before any); the batch
        form is :func:`kvscope.analysis.queue._hit_rate`."""
        prompts = sum(pr for _r, pr in self._recent)
        return min(max(sum(r for r, _p in self._recent) / prompts, 0.0), 1.0) if prompts > 0 else 0.0

    def _enqueue(self, req: _Req) -> None:
        """The request waits: kept in ``_queue`` (an index of the queued requests, so the head and
        the count are O(1) per iteration instead of a scan of every live request)."""
        req.queued = True
        if req.rid not in self._queue:
            if self._queue and req.seq < self._queue_last_seq:
                self._queue_in_order = False
            self._queue[req.rid] = req
            self._queue_last_seq = max(self._queue_last_seq, req.seq)

    def _unqueue(self, req: _Req) -> None:
        if req.queued:
            for p, q in req.q.items():
                self._queued[p] -= q
            req.q.clear()
            for p, part in req.q_rate.items():
                self._add_rate_part(p, part, -1.0)
            req.q_rate.clear()
            req.queued = False
            self._queue.pop(req.rid, None)
            if not self._queue:
                self._queue_in_order, self._queue_last_seq = True, 0

    def _queue_head(self) -> _Req | None:
        """The earliest live request (in first-seen order) that is queued."""
        if not self._queue:
            return None
        if self._queue_in_order:
            return next(iter(self._queue.values()))
        return min(self._queue.values(), key=lambda r: r.seq)

    def _projected(self, p: str) -> float:
        if p not in self._state or p not in self._configs:
            return math.nan
        _cap, avail = self._state[p]
        short = 0.0
        tgt = _TGT
        if p != tgt and tgt in self._state and tgt in self._configs:
            short_tok = max(self._need[tgt] + self.queued_blocks(tgt) - self._state[tgt][1] - self._decode[tgt], 0.0) \
                * self._configs[tgt]["tokens_per_block"]
            short = math.floor(short_tok / self._configs[p]["tokens_per_block"])
        return self._need.get(p, 0.0) + self.queued_blocks(p) - avail - self._decode.get(p, 0.0) - short

    # ---- per iteration: time to exhaustion, the trackers' iteration ends ----------------------------
    def _end_iteration(self) -> None:
        t, it = self._last_t, self._iteration
        for on_point in self._point_hooks:  # the iteration's end is a consistent point
            on_point(t, it, self._live)
        readings = self._live.exhaustion
        readings.clear()
        for p, _c in self._kv_cfgs:
            if p not in self._state:
                continue
            cap, avail = self._state[p]
            self._cum_alloc[p] += self._alloc_iter[p]
            self._alloc_iter[p] = 0.0
            win = self._window.get(p)
            if win is None:
                win = self._window[p] = deque(maxlen=self.cfg.rate_window_iterations + 1)
            win.append((t, self._cum_alloc[p], cap - avail))
            nwin = self._new_window.get(p)
            if nwin is None:
                nwin = self._new_window[p] = deque(
                    maxlen=max(self.cfg.burst_window_iterations, self.cfg.rate_window_iterations))
            nwin.append(self._new_iter[p])
            self._new_iter[p] = 0.0
            back = win[0]
            span_t, span_i = t - back[0], len(win) - 1
            passes = list(nwin)
            burst = max(passes[-self.cfg.burst_window_iterations:])  # the largest pass of new mirrors (the pass rule)
            roll, net = self._cum_alloc[p] - back[1], (cap - avail) - back[2]
            d = self._live.debt(p)
            certain = not math.isnan(d) and d > self.cfg.min_debt_blocks
            rate = roll / span_t if span_t > 0 else math.nan
            net_rate = net / span_t if span_t > 0 else math.nan
            proj = self._projected(p)
            margin = self.cfg.margin_blocks(cap)
            head, qnow = head_debt(self, p), queue_now_debt(self, p)
            alloc_it, free_it = (roll / span_i, (roll - net) / span_i) if span_i else (math.nan, math.nan)
            freed = self._freed_window.get(p)
            if freed is None:
                freed = self._freed_window[p] = deque(
                    maxlen=max(self.cfg.free_window_iterations, self.cfg.rate_window_iterations) + 1)
            freed.append(self._cum_alloc[p] - (cap - avail))
            resume, past, ceiling_room, by_pass, past_pass, ceiling_freed, ceiling_span, gate, gate_open = ceiling_risk(
                self, p, certain or self._guarded, alloc_it, free_it, burst, freed)
            # The pass hazard turns critical where the net growth, less the window's largest pass,
            # reaches the ceiling within the rate window anyway (the batch rule, exhaustion_arrays,
            # says why).
            closing = math.inf
            drift = net - max(passes[-span_i:]) if span_i else 0.0
            if by_pass and drift > 0:
                c = max(ceiling_room, 0.0) / (drift / span_i)
                closing = c if c <= self.cfg.rate_window_iterations else math.inf
            # The gate rule is critical once it has held gate_hold_iterations in a row (the batch
            # rule, exhaustion_arrays; DetectorConfig says why); at risk from the first.
            held_for = self._gate_held[p] = self._gate_held.get(p, 0) + 1 if gate else 0
            admits = (not certain and not self._guarded and head > margin and gate_open) or (
                held_for >= self.cfg.gate_hold_iterations)
            # An enforcing admission policy defers what the pool cannot back: no projection risk
            # then (the batch rule, exhaustion_arrays, says why).
            queue = not certain and not self._guarded and (
                (not math.isnan(proj) and proj > self.cfg.min_debt_blocks) or admits or gate or qnow > margin)
            # Read only when the basis can be "arrival" (no other use): skipped otherwise.
            arr_med, arr_max = (arrival_debt(self, p) if not certain and not queue and not self._guarded
                                and arrival_debt_bound(self, p) > self.cfg.min_debt_blocks else (-math.inf, -math.inf))
            arrival = not certain and not self._guarded and not queue and arr_max > self.cfg.min_debt_blocks
            admits = admits or (arrival and not self._guarded and gate_open and arr_med > margin
                                and len(self._recent_admissions) >= self.cfg.arrival_min_samples)
            if resume or by_pass:
                # Past the resume ceiling, what runs out first is the room below it.
                below = max(ceiling_room, 0.0)
                eta, eta_it = _div(below, rate), _div(below, roll / span_i if span_i else math.nan)
                basis = "resume" if resume else "pass"
            elif certain or queue or arrival:
                eta, eta_it = _div(avail, rate), _div(avail, roll / span_i if span_i else math.nan)
                basis = "debt" if certain else ("queue" if queue else "arrival")
            elif net_rate > 0:
                eta, eta_it, basis = _div(avail, net_rate), _div(avail, net / span_i), "trend"
            else:
                eta, eta_it, basis = math.inf, math.inf, ""
            self._eta[p] = (eta, eta_it, basis)
            if p in self._outside_pools:
                util = (cap - avail) / cap if cap > 0 else math.nan
                tgt = _TGT
                room = avail - self._need[p]
                tgt_room = math.inf
                if tgt in self._state and tgt in self._configs:
                    tgt_room = (self._state[tgt][1] - self._need[tgt]) * self._configs[tgt]["tokens_per_block"] \
                        / self._configs[p]["tokens_per_block"]
                binding = room < tgt_room - self.cfg.risk_margin_fraction * cap
                risk = basis in ("queue", "arrival", "resume", "pass") or (
                    basis == "trend" and not self._guarded and eta <= self.cfg.risk_horizon_s
                    and util >= self.cfg.risk_min_utilization and binding)
                readings[p] = ExhaustionReading(
                    eta, eta_it, basis, cap, avail, util, d, max(proj, head, qnow), rate, net_rate, admits, arr_med,
                    arr_max, past_pass if basis == "pass" else past, burst, closing, ceiling_freed, ceiling_span,
                ) if certain or risk else None
        for on_end in self._end_hooks:
            on_end(t, it, self._live)
        self._arrivals_now.clear()
