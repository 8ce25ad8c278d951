"""Pool sizing at engine creation: the KV byte budget TensorRT-LLM's stock
``KvCacheCreator._split_kv_cache_budget_for_draft`` split between target and draft, re-split by a
sizing plan (the hook is :func:`kvscope.engines.hooks.executor.split_kv_cache_budget_for_draft`;
a plan is remediation's :class:`remediation.sizing.BudgetSplit`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.events import EventKind, PoolRole, format_kv


def apply_budget_split(b: Any, creator: Any, plan: Callable[[int, tuple[int, int], tuple[int, int]], tuple[int, int]],
                       budget_attr: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> Any:
    """Re-split the byte budget the stock ``_split_kv_cache_budget_for_draft`` just split: ``plan``
    gets the total and the same affine costs, (slope, intercept) per pool, and returns the two
    shares, which replace the stock ones on the returned copies. POOL_SIZED says before and after.
    The stock result is returned untouched when the stock split did not split (budget unset, costs
    unavailable: the returned target config is the input one)."""
    target_in = args[0] if args else kwargs.get("target_kv_cache_config")
    if target_in is None:
        target_in = creator._kv_cache_config
    target_out, draft_out = result
    if draft_out is None or target_out is target_in:
        b.emit(EventKind.POOL_SIZED, -1, PoolRole.DRAFT,
               reason="stock split kept: the engine did not split this budget (unset, or no cache costs)")
        return result
    costs = creator._get_target_and_draft_cache_costs(target_in)
    if costs is None:
        b.emit(EventKind.POOL_SIZED, -1, PoolRole.DRAFT, reason="stock split kept: no target/draft cache costs")
        return result
    target_cost, draft_cost = costs
    total = int(getattr(target_in, budget_attr))
    before = (int(getattr(target_out, budget_attr)), int(getattr(draft_out, budget_attr)))
    target_bytes, draft_bytes = plan(total, (int(target_cost.slope), int(target_cost.intercept)),
                                     (int(draft_cost.slope), int(draft_cost.intercept)))
    if draft_bytes < draft_cost.intercept or target_bytes < target_cost.intercept \
            or target_bytes + draft_bytes > total:
        raise ValueError(f"plan gives target {target_bytes} B and draft {draft_bytes} B of {total} B")
    setattr(target_out, budget_attr, int(target_bytes))
    setattr(draft_out, budget_attr, int(draft_bytes))
    b.emit(EventKind.POOL_SIZED, -1, PoolRole.DRAFT, int(draft_bytes), 0, reason=format_kv({
        "budget": budget_attr, "total_bytes": total, "target_before": before[0], "draft_before": before[1],
        "target_after": int(target_bytes), "draft_after": int(draft_bytes),
        "plan": str(getattr(plan, "label", "plan")).replace(" ", "_")}))
    return result
