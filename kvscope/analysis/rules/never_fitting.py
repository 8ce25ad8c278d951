"""Never-fitting requests: a request whose full context (prompt + draft and extra tokens) needs more
blocks than a pool has.

Critical for a pool outside admission (the resize there can only raise), a warning for a pool in
admission (the request would wait forever), info when the request was rejected at arrival. No
thresholds: the pool's capacity is the rule.

Two drivers: :func:`find_never_fitting` over a whole event file (pandas, imported when it runs)
and :class:`NeverFittingTracker`, which checks each arrival against each configured pool with
:func:`arrival_finding` (and the live requests against a pool configured after they arrived) and
closes the finding at the request's end with :func:`ended_finding`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.rules.rule import Rule
from kvscope.events import REQUEST_OUTCOMES, EventKind, PoolRole, blocks_needed

_REJECTED = REQUEST_OUTCOMES[EventKind.ADMISSION_REJECTED]
_KV = (PoolRole.TARGET.value, PoolRole.DRAFT.value)
_ARRIVED, _CONFIGURED = EventKind.REQUEST_ARRIVED.value, EventKind.POOL_CONFIGURED.value
_END = {k.value: outcome for k, outcome in REQUEST_OUTCOMES.items()}  # rows carry kind values

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.rules.context import LiveContext, RunContext


def never_fitting_text(request: int, need_blocks: int, need_tokens: int, pool: str, capacity: int, rejected: bool,
                       in_admission: bool) -> str:
    """A request larger than a pool: rejected at arrival, or waiting forever (a pool in admission),
    or a resize that will raise (a pool outside it)."""
    return (f"request {request} needs {need_blocks} blocks ({need_tokens} tokens) in the {pool} pool, which has "
            f"{capacity}" + (" (rejected at arrival)." if rejected else
                             "; it can never fit" + ("." if in_admission else " and its resize there will raise.")))


def arrival_finding(rid: int, prompt: int, pool: str, c: dict, t: float, arrival_it: int,
                    it: int) -> Finding | None:
    """The streaming analyzer's check of one arrival (``prompt`` tokens) against one pool's config
    row ``c``: its finding, open while the request runs, or None when it fits."""
    tpb = c["tokens_per_block"]
    need_tok = prompt + c["max_draft_len"] + c["num_extra_kv_tokens"]
    need = blocks_needed(prompt, tpb, max_draft_len=c["max_draft_len"], num_extra_kv_tokens=c["num_extra_kv_tokens"])
    if need <= c["capacity_blocks"]:
        return None
    return Finding(
        kind=FindingKind.NEVER_FITTING, severity=Severity.WARNING if c["in_admission"] else Severity.CRITICAL,
        t_start_s=t, t_end_s=t, iteration_start=arrival_it, iteration_end=it, pools=(pool,),
        request_ids=(rid,),
        summary=never_fitting_text(rid, need, need_tok, pool, c["capacity_blocks"], False, bool(c["in_admission"])),
        evidence={"need_blocks": need, "need_tokens": need_tok, "capacity_blocks": c["capacity_blocks"],
                  "tokens_per_block": tpb, "prompt_tokens": prompt, "outcome": "running",
                  "in_admission": bool(c["in_admission"])},
    )


def ended_finding(f: Finding, outcome: str, t: float, it: int) -> Finding:
    """:func:`arrival_finding`'s finding at its request's end (``outcome``: a value of
    ``REQUEST_OUTCOMES``); a request rejected at arrival is info, as the batch rule says."""
    rejected = outcome == _REJECTED
    ev = dict(f.evidence, outcome=outcome)
    summary = f.summary if not rejected else never_fitting_text(
        f.request_ids[0], ev["need_blocks"], ev["need_tokens"], f.pools[0], ev["capacity_blocks"], True,
        ev["in_admission"])
    return replace(f, t_end_s=max(t, f.t_start_s), iteration_end=it, severity=Severity.INFO if rejected else f.severity,
                   evidence=ev, summary=summary)


class NeverFittingTracker:
    """The rule on a live stream (single consumer): a live request's arrival and end, and each
    POOL_CONFIGURED row (the live requests that arrived before it are checked then, as the batch
    analyzer, which sees the whole file, checks them). Its findings are the shared
    :class:`~kvscope.analysis.findings_log.FindingsLog`'s (``findings`` is empty); it keeps, per
    live request, the handles of its findings and the pools it was checked against."""

    row_kinds: frozenset[str] = frozenset({_CONFIGURED})
    request_kinds: frozenset[str] = frozenset({_ARRIVED, *_END})

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._handles: dict[int, list[int]] = {}  # live request -> its findings' handles in the log
        self._checked: dict[int, set[str]] = {}  # live request -> pools its prompt was checked against

    @property
    def findings(self) -> list[Finding]:
        return []

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        """POOL_CONFIGURED (after the analyzer recorded the config): check the live requests that arrived."""
        for req in live.reqs.values():
            if req.prompt >= 0:
                self._check(req, req.arrival_s, it, live)
        return None

    def on_request(self, req: Any, kind: str, pool: str, t: float, it: int, reason: str, live: LiveContext) -> None:
        """The request's arrival (check it) or end (close its findings with its outcome)."""
        if kind == _ARRIVED:
            self._check(req, t, it, live)
            return
        self._checked.pop(req.rid, None)
        log = live.log
        for h in self._handles.pop(req.rid, ()):
            if log.alive(h):
                log.put(h, ended_finding(log.get(h), _END[kind], t, it))

    def close(self, t: float, it: int, live: LiveContext) -> None:
        """The stream ended: the findings of requests still running end there."""
        for handles in self._handles.values():
            for h in handles:
                live.log.set_end(h, t, it)

    def _check(self, req: Any, t: float, it: int, live: LiveContext) -> None:
        checked = self._checked.setdefault(req.rid, set())
        for p, c in live.configs.items():
            if p not in _KV or c["capacity_blocks"] <= 0 or p in checked:
                continue
            checked.add(p)
            f = arrival_finding(req.rid, req.prompt, p, c, t, req.arrival_it, it)
            if f is not None:
                self._handles.setdefault(req.rid, []).append(live.log.add(f))


def find_never_fitting(
    events: pd.DataFrame | EventColumns, configs: pd.DataFrame, timeline: pd.DataFrame
) -> list[Finding]:
    """Requests whose full context (+ draft and extra tokens) needs more blocks than a pool has.

    Critical for a pool outside admission (the resize there can only raise), warning for a pool
    in admission (the request would wait forever), info when the request was rejected at arrival.
    """
    from kvscope.analysis.columns import as_columns

    if timeline.empty or configs.empty:
        return []
    stream_end = float(as_columns(events).ts_ns[-1]) / 1e9
    arrived = timeline[timeline["prompt_tokens"] >= 0]
    out = []
    for role, cfg in configs.iterrows():
        if role not in (PoolRole.TARGET.value, PoolRole.DRAFT.value) or cfg["capacity_blocks"] <= 0:
            continue
        tpb = int(cfg["tokens_per_block"])
        need_tokens = arrived["prompt_tokens"] + int(cfg["max_draft_len"]) + int(cfg["num_extra_kv_tokens"])
        need = -(-need_tokens // tpb)
        cap = int(cfg["capacity_blocks"])
        for req, nb in need[need > cap].items():
            row = arrived.loc[req]
            rejected = row["outcome"] == "rejected"
            sev = Severity.INFO if rejected else (Severity.WARNING if cfg["in_admission"] else Severity.CRITICAL)
            t0 = float(row["arrival_s"])
            t1 = float(row["end_s"]) if not np.isnan(row["end_s"]) else stream_end
            out.append(Finding(
                kind=FindingKind.NEVER_FITTING, severity=sev, t_start_s=t0, t_end_s=max(t0, t1),
                iteration_start=int(row["arrival_iteration"]), iteration_end=int(row["end_iteration"]),
                pools=(role,), request_ids=(int(req),),
                summary=never_fitting_text(int(req), int(nb), int(need_tokens[req]), str(role), cap, bool(rejected),
                                           bool(cfg["in_admission"])),
                evidence={"need_blocks": nb, "need_tokens": need_tokens[req], "capacity_blocks": cap,
                          "tokens_per_block": tpb, "prompt_tokens": row["prompt_tokens"],
                          "outcome": str(row["outcome"]), "in_admission": bool(cfg["in_admission"])},
            ))
    return out


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return find_never_fitting(run.ev, run.configs, run.timeline)


RULE = Rule(kinds=(FindingKind.NEVER_FITTING,), batch=_batch, tracker=NeverFittingTracker)
