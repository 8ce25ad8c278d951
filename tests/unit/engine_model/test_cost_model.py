"""Cost model: step time formula and deterministic MTP acceptance (single step == stretch)."""

from __future__ import annotations

import pytest

from kvscope.engine_model.cost_model import CostModel


def make_cost(max_draft_len: int = 1, rate: float = 0.875) -> CostModel:
    return CostModel(step_overhead_s=0.01, prefill_s_per_token=3e-5, decode_s_per_request=1e-4,
                     mtp_acceptance_rate=rate, max_draft_len=max_draft_len)


def test_step_time_is_affine_when_mixing_prefill_and_decode():
    cost = make_cost()
    assert cost.step_seconds(0, 0) == pytest.approx(0.01)
    assert cost.step_seconds(8192, 10) == pytest.approx(0.01 + 8192 * 3e-5 + 10 * 1e-4)


def test_expected_tokens_per_step_when_mtp_chain():
    assert make_cost(1).expected_tokens_per_step == pytest.approx(1.875)
    assert make_cost(3).expected_tokens_per_step == pytest.approx(1 + 0.875 + 0.875**2 + 0.875**3)
    assert make_cost(0).expected_tokens_per_step == 1.0


def test_stretch_accepts_same_as_single_steps_when_batched():
    cost = make_cost(3)
    phase, total = 0.37, 0
    for _ in range(50):
        accepted, phase = cost.accepted_drafts(phase, 1)
        assert 0 <= accepted <= 3
        total += accepted
    batched, batched_phase = cost.accepted_drafts(0.37, 50)
    assert batched == total
    assert batched_phase == pytest.approx(phase)


def test_steps_to_generate_is_minimal_when_counting_tokens():
    cost = make_cost(1)
    steps = cost.steps_to_generate(0.3, 100)
    assert steps == 54
    accepted, _ = cost.accepted_drafts(0.3, steps)
    assert steps + accepted >= 100
    accepted_prev, _ = cost.accepted_drafts(0.3, steps - 1)
    assert steps - 1 + accepted_prev < 100


def test_rejects_rate_when_outside_unit_interval():
    with pytest.raises(ValueError, match=r"mtp_acceptance_rate must be in \[0, 1\], got 1.2"):
        make_cost(1, rate=1.2)
