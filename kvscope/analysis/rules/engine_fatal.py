"""Engine failures: every ENGINE_FAILED row, with the request, the pool, what it asked, the pool's
state, the lead time of every earlier alarm finding and the alarm open on the failing pool.

It reads the other rules' findings (the leads), so it comes last in the rule table: every alarm
finding raised before the failure is a lead, whatever rule raised it (:func:`fatal_reading`, the
one definition both drivers use). Threshold: ``DetectorConfig.merge_gap_iterations`` (how far back
an alarm still counts as open).

Two drivers: :func:`find_engine_fatal` over a whole event file (numpy, the column view imported
when it runs, with the debt's state of the pool) and :class:`EngineFatalTracker`, which builds
:func:`live_fatal_finding` at the ENGINE_FAILED row from the findings the streaming analyzer holds;
both word the finding with :func:`fatal_text`. The streaming finding is raised at the failure with
the findings as they stood then, and read again at the stream's end against the findings as they
ended, as the batch driver reads them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.incidents import best_lead, fatal_leads, open_alarm
from kvscope.analysis.rules.rule import Rule
from kvscope.analysis.wording import alarm_open_text
from kvscope.events import EventKind, PoolRole

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.debt import DebtResult
    from kvscope.analysis.rules.context import LiveContext, RunContext

_FAILED = EventKind.ENGINE_FAILED.value


def fatal_text(request: int, pool: str, asked_tokens: int, message: str | None, named_lead: int | None,
               lead_kind: str | None, open_alarm: dict | None = None) -> str:
    """An engine failure: request, pool, what it asked, the engine's whole message, the earliest
    finding that named the request (or that none did), and the alarm open on the pool when it
    started earlier (:func:`~kvscope.analysis.incidents.open_alarm`)."""
    # A resize asks for a capacity; a refused resume asks for none (its message says what failed).
    asked = f" (asked {asked_tokens} tokens)" if asked_tokens > 0 else ""
    text = (f"engine failed on request {request} in the {pool} pool{asked}: {message or ''}"
            + (f" — first named {named_lead} iterations earlier by {lead_kind}" if named_lead is not None
               else " — no earlier finding named this request"))
    if open_alarm is not None and (named_lead is None or open_alarm["lead_iterations"] > named_lead):
        text += f"; the {pool} pool had a {alarm_open_text(open_alarm, 'earlier', False)}"
    return text + "."


class FatalReading(NamedTuple):
    """What one failure reads of the findings raised before it."""

    leads: list[dict]
    """The lead of every earlier alarm finding (:func:`~kvscope.analysis.incidents.fatal_leads`)."""
    best: dict | None
    """The lead that named the failing request earliest (None: none did)."""
    opened: dict | None
    """The alarm open on the failing pool (:func:`~kvscope.analysis.incidents.open_alarm`)."""


def fatal_reading(prior: Sequence[Finding], rank: Mapping[FindingKind, int], request: int, pool: str, t: float,
                  it: int, within: int) -> FatalReading:
    """A failure at (t, it) on ``request`` in ``pool`` against ``prior``, every finding the other
    rules raised (the batch's: those of the rules before this one in the table; the streaming
    analyzer's: every finding it holds). A warning that came before the failure is a lead whatever
    its kind. ``prior`` is read in the rule table's order (``rank``, the drivers' ``kind_rank``), each
    rule's findings by start, so both drivers list the leads alike; ``within`` is the merge gap an open
    alarm may end before the failure."""
    ordered = sorted(prior, key=lambda f: (rank.get(f.kind, len(rank)), f.t_start_s))
    leads = fatal_leads(ordered, request, t, it)
    return FatalReading(leads, best_lead(leads), open_alarm(ordered, pool, t, it, within))


def live_fatal_finding(rid: int, pool: str, nt: int, state: dict, reason: str, t: float,
                       it: int, prior: Sequence[Finding], rank: Mapping[FindingKind, int], within: int) -> Finding:
    """The finding of one ENGINE_FAILED row as the streaming analyzer reads it: ``state`` is the
    pool's (:func:`live_pool_state`), ``prior`` the findings the analyzer holds (:func:`fatal_reading`)."""
    leads, best, opened = fatal_reading(prior, rank, rid, pool, t, it, within)
    return Finding(
        kind=FindingKind.ENGINE_FATAL, severity=Severity.CRITICAL, t_start_s=t, t_end_s=t, iteration_start=it,
        iteration_end=it, pools=(pool,) if pool != PoolRole.NONE.value else (), request_ids=(rid,) if rid >= 0 else (),
        summary=fatal_text(rid, pool, nt, reason, best["named_lead_iterations"] if best else None,
                           best["kind"] if best else None, opened),
        evidence={"message": reason, "asked_tokens": nt, "lead_times": leads,
                  "pool_state": state,
                  "lead_iterations": best["named_lead_iterations"] if best else None,
                  "lead_kind": best["kind"] if best else None, "open_alarm": opened},
    )


def live_pool_state(pool: str, row: tuple[int, int, int, int], live: LiveContext) -> dict:
    """The failing pool's state as the batch driver reports it: the row's (capacity, free,
    evictable, reserved) blocks (-1, not recorded: None), and where the pool's debt is known, its
    debt and need, with its capacity and available blocks when the row has none."""
    state: dict = {k: (v if v >= 0 else None)
                   for k, v in zip(("capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks"), row)}
    debt = live.debt(pool)
    if not math.isnan(debt):
        state["debt_blocks"], state["need_blocks"] = debt, live.need.get(pool, 0.0)
        if state["capacity_blocks"] is None:
            state["capacity_blocks"], state["available_blocks"] = live.state[pool]
    return state


_REQ_RE = re.compile(r"request (\d+)")


def find_engine_fatal(
    events: pd.DataFrame | EventColumns, debt: DebtResult, prior: list[Finding], rank: Mapping[FindingKind, int],
    cfg: DetectorConfig | None = None,
) -> list[Finding]:
    """ENGINE_FAILED events with the request, pool, asked size, pool state, the lead time of
    every earlier alarm finding (``evidence["lead_times"]``) and the alarm open on the failing pool
    (``evidence["open_alarm"]``, within ``cfg.merge_gap_iterations``)."""
    from kvscope.analysis.columns import as_columns
    from kvscope.analysis.frame import K, _pool_name

    within = (cfg or DetectorConfig()).merge_gap_iterations
    ev = as_columns(events)
    kind = ev.kind
    fpos = ev.positions(EventKind.ENGINE_FAILED)
    out = []
    ts, it = ev.ts_ns, ev.iteration
    reserved = ev.values_at("reserved_blocks", fpos)
    for p, reason, res in zip(fpos, ev.reason_at(fpos), reserved):
        row = {c: int(getattr(ev, c)[p]) for c in ("request_id", "num_tokens", "capacity_blocks", "free_blocks",
                                                   "evictable_blocks")}
        row["reserved_blocks"] = int(res)
        req = row["request_id"]
        if req < 0 and (m := _REQ_RE.search(reason)):
            req = int(m.group(1))
        role = _pool_name(int(ev.pool[p]))
        t = ts[p] / 1e9
        # The event file's -1 is "not recorded": unknown (None) in the evidence, never a count.
        state = {k: (row[k] if row[k] >= 0 else None)
                 for k in ("capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks")}
        f = debt.full.get(role)
        if f is not None:
            state["debt_blocks"] = debt.at(role, "debt", p)
            state["need_blocks"] = debt.at(role, "need", p)
            if state["capacity_blocks"] is None:
                state["capacity_blocks"] = debt.at(role, "capacity", p)
                state["available_blocks"] = debt.at(role, "available", p)
        leads, best, opened = fatal_reading(prior, rank, req, role, t, int(it[p]), within)
        out.append(Finding(
            kind=FindingKind.ENGINE_FATAL, severity=Severity.CRITICAL, t_start_s=t, t_end_s=t,
            iteration_start=it[p], iteration_end=it[p], pools=(role,) if role != "none" else (),
            request_ids=(req,) if req >= 0 else (),
            summary=fatal_text(req, role, int(row["num_tokens"]), reason, best["named_lead_iterations"] if best else None,
                               best["kind"] if best else None, opened),
            evidence={
                "message": reason, "asked_tokens": int(row["num_tokens"]), "pool_state": state,
                "lead_times": leads,
                "lead_iterations": best["named_lead_iterations"] if best else None,
                "lead_kind": best["kind"] if best else None,
                "open_alarm": opened,
                "num_failed_after": int(((kind[p:] == K[EventKind.REQUEST_FAILED])).sum()),
            },
        ))
    return out


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return find_engine_fatal(run.ev, run.debt, list(prior), run.kind_rank, run.cfg)


class EngineFatalTracker:
    """The rule on a live stream: each ENGINE_FAILED row, read after the other trackers read it,
    against every finding held so far (:func:`fatal_reading`), and again at the stream's end against
    the findings as they ended. Its findings are the shared
    :class:`~kvscope.analysis.findings_log.FindingsLog`'s (``findings`` is empty); it keeps each
    kept one's row (ENGINE_FAILED rows are few: one per failure)."""

    row_kinds: frozenset[str] = frozenset({_FAILED})

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._rows: list[tuple] = []  # (handle, the finding's row fields) of the kept findings

    @property
    def findings(self) -> list[Finding]:
        return []

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        fields = (rid, pool, nt, live_pool_state(pool, (cap, free, evict, live.row_reserved), live), reason, t, it)
        h = live.log.add(live_fatal_finding(*fields, live.held_findings(), live.kind_rank, self.cfg.merge_gap_iterations))
        self._rows = [r for r in self._rows if live.log.alive(r[0])] + [(h, fields)]
        return None

    def close(self, t: float, it: int, live: LiveContext) -> None:
        """The stream ended: each kept finding read against the findings as they ended."""
        prior = live.held_findings()
        for h, fields in self._rows:
            if live.log.alive(h):
                live.log.put(h, live_fatal_finding(*fields, prior, live.kind_rank, self.cfg.merge_gap_iterations))


RULE = Rule(kinds=(FindingKind.ENGINE_FATAL,), batch=_batch, tracker=EngineFatalTracker)
