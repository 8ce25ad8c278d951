"""Reuse loss: prefix tokens the target reused that an unpaired draft mirror had to hold again.

A cost report, not an alarm: the total, the duplicated blocks held at once (peak) and its share of
the draft pool; a warning from ``DetectorConfig.reuse_loss_warn_fraction`` of the pool, info
below. At most ``max_named_requests`` requests are named (the largest losses).

Two drivers: :func:`find_reuse_loss` over a whole event file (pandas, imported when it runs) and
the streaming analyzer, which counts each admitted request's loss while it lives (on its shared
request table) and reports the summary at ``close()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.rules.rule import Rule
from kvscope.events import PoolRole

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.rules.context import RunContext


def find_reuse_loss(
    events: pd.DataFrame | EventColumns, configs: pd.DataFrame, timeline: pd.DataFrame, cfg: DetectorConfig
) -> list[Finding]:
    """Prefix tokens the target reused that an unpaired draft mirror had to hold privately.

    Reports the total, the duplicated blocks held at once (peak) and its share of the draft pool.
    """
    from kvscope.analysis.columns import as_columns

    out: list[Finding] = []
    if timeline.empty:
        return out
    for role, pc in configs.iterrows():
        if role == PoolRole.TARGET.value or pc["paired"] or role not in (PoolRole.DRAFT.value,):
            continue
        adm = timeline[timeline["admitted_s"].notna()]
        lost = (adm["reused_tokens_target"] - adm[f"reused_tokens_{role}"]).clip(lower=0)
        lost = lost[lost > 0]
        if lost.empty:
            continue
        tpb = int(pc["tokens_per_block"])
        lost_blocks = -(-lost // tpb)
        t0 = adm.loc[lost.index, "admitted_s"].to_numpy()
        t1 = adm.loc[lost.index, "end_s"].fillna(np.inf).to_numpy()
        times = np.concatenate([t0, t1])
        delta = np.concatenate([lost_blocks.to_numpy(), -lost_blocks.to_numpy()])
        order = np.lexsort((delta, times))  # frees before admissions at the same instant
        conc = np.cumsum(delta[order])
        ipk = int(np.argmax(conc))
        peak = float(conc[ipk])
        cap = max(int(pc["capacity_blocks"]), 1)
        frac = peak / cap
        ev = as_columns(events)
        stream_end = float(ev.ts_ns[-1]) / 1e9
        top = lost.sort_index().sort_values(ascending=False, kind="stable").index[: cfg.max_named_requests]
        out.append(Finding(
            kind=FindingKind.REUSE_LOSS,
            severity=Severity.WARNING if frac >= cfg.reuse_loss_warn_fraction else Severity.INFO,
            t_start_s=float(t0.min()), t_end_s=max(float(t0.min()), min(float(np.max(t1)), stream_end)),
            iteration_start=int(adm.loc[lost.index, "admitted_iteration"].min()),
            iteration_end=int(ev.iteration[-1]),
            pools=(PoolRole.TARGET.value, role), request_ids=tuple(int(x) for x in top),
            summary=(
                f"the unpaired {role} mirrors held {int(lost.sum())} prefix tokens the target reused "
                f"({len(lost)} requests); at peak {peak:.0f} duplicated blocks, {frac:.0%} of the {role} pool."
            ),
            evidence={
                "lost_tokens": int(lost.sum()), "lost_blocks": int(lost_blocks.sum()),
                "lost_bytes": int(lost.sum()) * int(pc["bytes_per_token"]),
                "peak_concurrent_lost_blocks": peak, "peak_fraction_of_pool": frac,
                "t_peak_s": float(times[order][ipk]), "num_requests": len(lost),
                "target_reused_tokens": int(adm["reused_tokens_target"].sum()),
                "draft_reused_tokens": int(adm[f"reused_tokens_{role}"].sum()), "capacity_blocks": cap,
            },
        ))
    return out


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return find_reuse_loss(run.ev, run.configs, run.timeline, run.cfg)


RULE = Rule(kinds=(FindingKind.REUSE_LOSS,), batch=_batch)
