"""Never-fitting requests: a request whose full context (prompt + draft and extra tokens) needs more
blocks than a pool has.

Critical for a pool outside admission (the resize there can only raise), a warning for a pool in
admission (the request would wait forever), info when the request was rejected at arrival. No
thresholds: the pool's capacity is the rule.

Two drivers: :func:`find_never_fitting` over a whole event file (pandas, imported when it runs)
and the streaming analyzer, which checks each arrival against the configured pools as it reads it
(its request table is shared by several rules) and words its findings with
:func:`never_fitting_text`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.rules.rule import Rule
from kvscope.events import PoolRole

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.rules.context import RunContext


def never_fitting_text(request: int, need_blocks: int, need_tokens: int, pool: str, capacity: int, rejected: bool,
                       in_admission: bool) -> str:
    """A request larger than a pool: rejected at arrival, or waiting forever (a pool in admission),
    or a resize that will raise (a pool outside it)."""
    return (f"request {request} needs {need_blocks} blocks ({need_tokens} tokens) in the {pool} pool, which has "
            f"{capacity}" + (" (rejected at arrival)." if rejected else
                             "; it can never fit" + ("." if in_admission else " and its resize there will raise.")))


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


RULE = Rule(kinds=(FindingKind.NEVER_FITTING,), batch=_batch)
