"""Engine failures: every ENGINE_FAILED row, with the request, the pool, what it asked, the pool's
state, the lead time of every earlier alarm finding and the alarm open on the failing pool.

It reads the other rules' findings (the leads), so it comes last in the rule table. Threshold:
``DetectorConfig.merge_gap_iterations`` (how far back an alarm still counts as open).

Two drivers: :func:`find_engine_fatal` over a whole event file (numpy, the column view imported
when it runs, with the debt's state of the pool) and :class:`EngineFatalTracker`, which builds
:func:`live_fatal_finding` at the ENGINE_FAILED row from the findings the streaming analyzer holds;
both word the finding with :func:`fatal_text`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

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


def live_fatal_finding(rid: int, pool: str, nt: int, state: tuple[int, int, int, int], reason: str, t: float,
                       it: int, prior: list[Finding], within: int) -> Finding:
    """The finding of one ENGINE_FAILED row as the streaming analyzer reads it: ``state`` is the
    row's (capacity, free, evictable, reserved) blocks (-1: not recorded), ``prior`` the findings
    raised before it, ``within`` the merge gap an open alarm may end before the failure."""
    leads = fatal_leads(prior, rid, t, it)
    best = best_lead(leads)
    opened = open_alarm(prior, pool, t, it, within)
    return Finding(
        kind=FindingKind.ENGINE_FATAL, severity=Severity.CRITICAL, t_start_s=t, t_end_s=t, iteration_start=it,
        iteration_end=it, pools=(pool,) if pool != PoolRole.NONE.value else (), request_ids=(rid,) if rid >= 0 else (),
        summary=fatal_text(rid, pool, nt, reason, best["named_lead_iterations"] if best else None,
                           best["kind"] if best else None, opened),
        evidence={"message": reason, "asked_tokens": nt, "lead_times": leads,
                  "pool_state": {k: (v if v >= 0 else None) for k, v in zip(
                      ("capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks"), state)},
                  "lead_iterations": best["named_lead_iterations"] if best else None,
                  "lead_kind": best["kind"] if best else None, "open_alarm": opened},
    )


_REQ_RE = re.compile(r"request (\d+)")


def find_engine_fatal(
    events: pd.DataFrame | EventColumns, debt: DebtResult, prior: list[Finding], cfg: DetectorConfig | None = None,
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
        leads = fatal_leads(prior, req, t, int(it[p]))
        best = best_lead(leads)
        opened = open_alarm(prior, role, t, int(it[p]), within)
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
    return find_engine_fatal(run.ev, run.debt, list(prior), run.cfg)


class EngineFatalTracker:
    """The rule on a live stream: each ENGINE_FAILED row, read after the other trackers read it,
    with the findings held so far as its leads. Its findings are the shared
    :class:`~kvscope.analysis.findings_log.FindingsLog`'s (``findings`` is empty)."""

    row_kinds: frozenset[str] = frozenset({_FAILED})

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    @property
    def findings(self) -> list[Finding]:
        return []

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        prior = live.log.items + [f for t_ in live.trackers if getattr(t_, "leads_fatal", False) for f in t_.findings]
        live.log.add(live_fatal_finding(rid, pool, nt, (cap, free, evict, live.row_reserved), reason, t, it, prior,
                                        self.cfg.merge_gap_iterations))
        return None


RULE = Rule(kinds=(FindingKind.ENGINE_FATAL,), batch=_batch, tracker=EngineFatalTracker)
