"""Reuse loss: prefix tokens the target reused that an unpaired draft mirror had to hold again.

A cost report, not an alarm: the total, the duplicated blocks held at once (peak) and its share of
the draft pool; a warning from ``DetectorConfig.reuse_loss_warn_fraction`` of the pool, info
below. At most ``max_named_requests`` requests are named (the largest losses).

Two drivers: :func:`find_reuse_loss` over a whole event file (pandas, imported when it runs) and
:class:`ReuseLossTracker`, which reads a live request's admission, reuse and end rows (with the
analyzer's record of it) and adds the summary to the shared findings at the stream's end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.rules.context import HookTracker
from kvscope.analysis.rules.rule import Rule
from kvscope.events import REQUEST_OUTCOMES, EventKind, PoolRole

_DRAFT = PoolRole.DRAFT.value
_ADMITTED, _REUSED = EventKind.ADMITTED.value, EventKind.BLOCKS_REUSED.value
_END = frozenset(k.value for k in REQUEST_OUTCOMES)

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.rules.context import LiveContext, RunContext


class ReuseLossTracker(HookTracker):
    """The rule on a live stream (single consumer; O(1) per row it reads, the named requests bounded
    by ``max_named_requests``). A request starts losing at the first of its rows read while it is
    counted in the pools (its admission, or a later reuse row); the summary is a finding of the
    shared :class:`~kvscope.analysis.findings_log.FindingsLog` (``findings`` is empty)."""

    # What the target reused is set at admission and what the draft reused at its reuse rows: the
    # rows after which what a request lost can change.
    request_kinds: frozenset[str] = frozenset({_ADMITTED, _REUSED, *_END})

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.lost: dict[int, tuple[float, float]] = {}
        """Live requests that lost reuse -> (lost tokens, lost blocks)."""
        self.is_open = False
        """A request started losing in the current instant: :meth:`settle` once it is over."""
        self._total = [0.0, 0.0, 0.0, 0]  # tokens, blocks, peak concurrent blocks, requests
        self._first = (math.inf, -1)  # (time, iteration) of the first loss
        self._last_end = -math.inf  # when the last request that lost reuse ended
        self._top: dict[int, float] = {}  # the max_named_requests largest losses
        self._live = 0.0  # sum of the live requests' lost blocks
        self._open_t = math.nan  # the instant a request started losing in, while is_open

    def on_request(self, req: Any, kind: str, pool: str, t: float, it: int, reason: str, live: LiveContext) -> None:
        """A live request's admission or reuse (it may start losing) or its end."""
        if kind in _END:
            self.ended(req.rid, t)
        elif req.counted and req.rid not in self.lost:
            draft = live.configs.get(_DRAFT)
            if draft is not None:
                self.started(req.rid, req.target_reuse, req.reused.get(_DRAFT, 0.0), req.admitted_it, t, draft)

    def close(self, t: float, it: int, live: LiveContext) -> None:
        """The stream ended at (t, it): its summary, if a request lost reuse."""
        f = self.summary(live.configs.get(_DRAFT), t, it)
        if f is not None:
            live.log.add(f)

    def started(self, rid: int, target_reuse: float, draft_reused: float, admitted_it: int, t: float,
                draft: dict) -> None:
        """A request counted in the pools: what the target reused that the (unpaired) draft did not."""
        if draft["paired"]:
            return
        lost = max(target_reuse - draft_reused, 0.0)
        if lost <= 0:
            return
        if self.is_open and t != self._open_t:
            self.settle()
        blocks = float(-(-int(lost) // draft["tokens_per_block"]))
        self.lost[rid] = (lost, blocks)
        tot = self._total
        tot[0] += lost
        tot[1] += blocks
        tot[3] += 1
        self._live += blocks  # whole blocks: the running sum is exact
        self.is_open, self._open_t = True, t  # the peak is read once the instant is over (settle)
        self._top[rid] = lost
        if len(self._top) > self.cfg.max_named_requests:
            worst = min(self._top, key=lambda r: (self._top[r], -r))
            del self._top[worst]
        if t < self._first[0]:
            self._first = (t, admitted_it)

    def settle(self) -> None:
        """The duplicated blocks held at once, read at the end of an instant that admitted a
        request: a request admitted and ended in the same instant (the engine died in that
        iteration, before its mirror held anything) never held them (the batch rule orders an
        instant's ends before its admissions)."""
        tot = self._total
        tot[2] = max(tot[2], self._live)
        self.is_open = False

    def ended(self, rid: int, t: float) -> None:
        lost = self.lost.pop(rid, None)
        if lost is not None:
            if self.is_open and t != self._open_t:
                self.settle()
            self._live -= lost[1]
            self._last_end = max(self._last_end, t)

    def summary(self, draft: dict | None, t: float, it: int) -> Finding | None:
        """The summary at the end of the stream (``t``, ``it``: its last event); None when no request
        lost reuse or the draft pool was never configured."""
        if self.is_open:
            self.settle()
        d = PoolRole.DRAFT.value
        tokens, blocks, peak, nreq = self._total
        if nreq == 0 or draft is None:
            return None
        cap = max(draft["capacity_blocks"], 1)
        frac = peak / cap
        return Finding(
            kind=FindingKind.REUSE_LOSS,
            severity=Severity.WARNING if frac >= self.cfg.reuse_loss_warn_fraction else Severity.INFO,
            # to the end of the last request that lost reuse (the end of the events while one lives)
            t_start_s=self._first[0],
            t_end_s=max(t if self.lost else min(self._last_end, t), self._first[0]),
            iteration_start=self._first[1], iteration_end=it, pools=(PoolRole.TARGET.value, d),
            request_ids=tuple(sorted(self._top, key=lambda r: (-self._top[r], r))),
            summary=f"the unpaired {d} mirrors held {int(tokens)} prefix tokens the target reused ({nreq} requests); "
                    f"at peak {peak:.0f} duplicated blocks, {frac:.0%} of the {d} pool.",
            evidence={"lost_tokens": int(tokens), "lost_blocks": int(blocks), "peak_concurrent_lost_blocks": peak,
                      "peak_fraction_of_pool": frac, "num_requests": nreq, "capacity_blocks": cap},
        )


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


RULE = Rule(kinds=(FindingKind.REUSE_LOSS,), batch=_batch, tracker=ReuseLossTracker)
