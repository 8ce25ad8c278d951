"""Event fidelity of the binding: pool state per event, one prefix hit per admission, a deferral for
every waiting request, the pools' real per-token cost."""

from __future__ import annotations

from kvscope.engine_model.replay import build_engine, resolve
from kvscope.engines.instrumentor import instrument
from kvscope.events import EventKind, PoolRole
from kvscope.recording import Recorder

K = EventKind
T, D, N = PoolRole.TARGET, PoolRole.DRAFT, PoolRole.NONE


def _configured(scenario: str) -> list[tuple]:
    base, _, _ = resolve(scenario)
    parts = build_engine(base)
    rec = Recorder(capacity=1 << 10)
    instrument(recorder=rec, engine=parts.executor)
    return [(e.pool, e.num_blocks, e.num_tokens) for e in rec.drain() if e.kind is K.POOL_CONFIGURED]


def test_pool_configured_reports_the_budget_split_cost_when_pools_are_sized_from_bytes():
    assert _configured("glm5-dsa") == [(T, 49968, 64), (D, 1284, 64)]


def test_pool_configured_reports_unknown_cost_when_pools_are_given_in_blocks():
    # qwen-hybrid-mtp's pools are given in blocks; GLM's slopes (the knob defaults) are not its cost.
    assert _configured("qwen-hybrid-mtp") == [(T, 0, 32), (D, 0, 32)]
