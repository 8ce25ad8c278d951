"""Pool sizing composed with the engine model and the instrumented engine: ``kvscope replay --sizing``
(a plan from a share, a ratio, or the usage a probe replay or a recorded run shows) and
``KVSCOPE_SIZING`` at engine start (the budget-split hook of the binding).

The plans' arithmetic is ``remediation.sizing``'s; this module reads what it needs from a replay
configuration, a probe replay or an event file, which ``remediation`` may not import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvscope.engines.binding import Binding
from remediation.sizing import (
    BudgetSplit,
    SizingPlan,
    parse_sizing,
    plan_split,
    ratio_from_observation,
)

__all__ = ["observe_for_sizing", "observed_from_events", "sized_config", "sizing_from_env"]


def sized_config(config: Any, sizing: str, *, observed: tuple[float, float] | None = None) -> tuple[Any, SizingPlan]:
    """``config`` with its two pools re-split by ``--sizing`` (the engine model's budget-split knob:
    the pool sizes the split produces), and the plan.

    ``sizing``: ``auto`` (needs ``observed`` = peak draft and target tokens in use from a recorded
    run or probe), a draft byte share such as ``0.09``, or a token ratio such as ``4x``.

    Raises:
        ValueError: the config's pools are given in blocks (no byte budget to split), or a bad value.
    """
    if int(getattr(config, "max_gpu_total_bytes", 0) or 0) <= 0:
        raise ValueError("--sizing needs a KV byte budget to split (max_gpu_total_bytes > 0); this "
                         "configuration gives its pools in blocks")
    kind, value = parse_sizing(sizing)
    common = dict(target_bytes_per_token=int(config.target_bytes_per_token),
                  draft_bytes_per_token=int(config.draft_bytes_per_token),
                  tokens_per_block=int(config.tokens_per_block),
                  target_fixed_bytes=int(getattr(config, "target_fixed_bytes", 0) or 0),
                  draft_fixed_bytes=int(getattr(config, "draft_fixed_bytes", 0) or 0))
    if kind == "auto":
        if observed is None:
            raise ValueError("--sizing auto needs observed usage (a probe replay or a recorded run)")
        ratio = ratio_from_observation(*observed)
        plan = plan_split(int(config.max_gpu_total_bytes), draft_token_ratio=ratio,
                          basis=f"observed: peak draft {observed[0]:.0f} / target {observed[1]:.0f} tokens",
                          **common)
    elif kind == "ratio":
        plan = plan_split(int(config.max_gpu_total_bytes), draft_token_ratio=value, **common)
    else:
        plan = plan_split(int(config.max_gpu_total_bytes), draft_byte_share=value, **common)
    return replace(config, num_target_blocks=plan.target_blocks, num_draft_blocks=plan.draft_blocks), plan


def observe_for_sizing(source: str, overrides: list[str], *, probe_requests: int = 0) -> tuple[float, float]:
    """Peak draft and target tokens in use on ``source`` with the draft pool out of the way (a probe
    replay with a draft pool 16x the target's tokens, remediation off): what the traffic needs."""
    from kvscope import replay

    base, _, _ = replay.resolve(source)
    config = base.with_overrides(overrides)
    target_blocks, draft_blocks = config.pool_blocks()
    probe = [*overrides, f"num_target_blocks={target_blocks}", f"num_draft_blocks={target_blocks * 16}"]
    if probe_requests:
        probe.append(f"max_requests={probe_requests}")
    summary = replay.run(source, probe)
    peak = summary.peak_utilization
    tpb = config.tokens_per_block
    return (peak.get("draft", 0.0) * target_blocks * 16 * tpb, peak.get("target", 0.0) * target_blocks * tpb)


def observed_from_events(paths: Any) -> tuple[float, float]:
    """Peak draft and target tokens in use in a recorded run (its POOL_SNAPSHOT rows: capacity -
    free - evictable, times tokens per block from POOL_CONFIGURED). A run that crashed on the draft
    pool still tells the ratio the traffic needed up to the crash. ``paths``: event files, or their
    frame when the caller has read it already."""
    import pandas as pd

    from kvscope.recording import read_frame

    frame = paths if isinstance(paths, pd.DataFrame) else read_frame(paths)
    configured = frame[frame["kind"] == "pool_configured"]
    tokens_per_block = {str(p): int(t) for p, t in zip(configured["pool"], configured["num_tokens"])}
    snaps = frame[frame["kind"] == "pool_snapshot"]
    peaks = {}
    for pool in ("draft", "target"):
        rows = snaps[snaps["pool"] == pool]
        if rows.empty or pool not in tokens_per_block:
            raise ValueError(f"no {pool} pool snapshots in the recorded run: cannot size from it")
        used = rows["capacity_blocks"] - rows["free_blocks"] - rows["evictable_blocks"].clip(lower=0)
        peaks[pool] = float(used.max()) * tokens_per_block[pool]
    return peaks["draft"], peaks["target"]


def sizing_from_env(binding: Binding, env: Mapping[str, str] | None = None) -> BudgetSplit | None:
    """``KVSCOPE_SIZING=0.09|4x``: the plan the budget-split hook applies at engine start (same
    semantics as ``kvscope replay --sizing``). Raises ValueError (one line) on a bad value."""
    env = os.environ if env is None else env
    value = env.get("KVSCOPE_SIZING", "").strip()
    if not value:
        return None
    plan = BudgetSplit.parse(value)
    binding.budget_split = plan
    return plan
