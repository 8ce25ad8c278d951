from __future__ import annotations

import pytest
from remediation_helpers import DRAFT, make_request, make_view

from kvscope.events import EventKind, PoolRole
from kvscope.port import Verdict
from remediation.policies import (
    POLICIES,
    DraftReservePolicy,
    JointAdmissionPolicy,
    WorstCasePolicy,
    create_policy,
)

# DRAFT: 20 blocks of 4 tokens, 1 draft slot, resume ceiling 0.95 -> 19 usable blocks.
# make_request(prompt=10, output=5): (10 + 5 + 1) / 4 = 4 blocks.


def test_admits_until_the_draft_ledger_reaches_the_resume_ceiling_then_defers():
    events = []
    policy = DraftReservePolicy(emit=events.append)
    policy.begin_pass(make_view(0))
    verdicts = [policy.decide(make_request(rid)).verdict for rid in range(1, 7)]
    assert verdicts == [Verdict.ADMIT] * 4 + [Verdict.DEFER] * 2  # 4 x 4 = 16 <= 19 < 20
    deferred = policy.decide(make_request(9))
    assert (deferred.pool, deferred.num_blocks_short) == (PoolRole.DRAFT, 1)
    assert policy.ledger.total(PoolRole.DRAFT) == 16
    assert [e.kind for e in events] == [EventKind.RESERVATION_MADE] * 4
    assert [e.num_blocks for e in events] == [4, 4, 4, 4]


def test_release_frees_room_for_a_deferred_request_when_one_ends():
    policy = DraftReservePolicy()
    policy.begin_pass(make_view(0))
    for rid in range(1, 5):
        policy.decide(make_request(rid))
    assert policy.decide(make_request(5)).verdict is Verdict.DEFER
    policy.release(2)
    policy.begin_pass(make_view(1))
    assert policy.decide(make_request(5)).verdict is Verdict.ADMIT
    assert policy.stats.reservations_released == 1 and policy.stats.requests_deferred == 1


def test_later_chunks_and_secured_requests_are_admitted_without_a_new_reservation():
    policy = DraftReservePolicy()
    policy.begin_pass(make_view(0))
    assert policy.decide(make_request(1)).is_admit
    assert policy.decide(make_request(1, first=False, position=8)).is_admit
    assert policy.ledger.total(PoolRole.DRAFT) == 4 and policy.stats.reservations_made == 1


def test_rejects_a_request_whose_need_exceeds_the_pool_when_it_can_never_fit():
    policy = DraftReservePolicy()
    policy.begin_pass(make_view(0))
    decision = policy.decide(make_request(1, prompt=80, output=10))  # (80 + 10 + 1) / 4 = 23 > 20
    assert decision.verdict is Verdict.REJECT
    assert (decision.pool, decision.num_blocks_needed, decision.num_blocks_capacity) == (PoolRole.DRAFT, 23, 20)
    assert "needs 23 blocks" in decision.reason and "the pool has 20" in decision.reason
    assert policy.stats.rejected_by_reason == {"draft need exceeds pool": 1}


def test_an_empty_pool_admits_a_request_above_the_ceiling_when_it_fits_the_pool():
    policy = DraftReservePolicy()
    policy.begin_pass(make_view(0))
    assert policy.decide(make_request(1, prompt=70, output=5)).is_admit  # 19 blocks: 76 tokens
    assert policy.decide(make_request(2, prompt=1, output=1)).verdict is Verdict.DEFER


def test_stall_guard_sets_the_oldest_deferred_need_aside_when_it_waited_too_long():
    policy = DraftReservePolicy(max_wait_passes=3)
    policy.begin_pass(make_view(0))
    assert policy.decide(make_request(1, prompt=40, output=10)).is_admit   # 13 blocks
    assert policy.decide(make_request(2, prompt=40, output=10)).verdict is Verdict.DEFER  # needs 13, 6 left
    for it in range(1, 3):  # small requests keep fitting around the waiting one
        policy.begin_pass(make_view(it))
        assert policy.decide(make_request(10 + it, prompt=2, output=1)).is_admit
        policy.release(10 + it)
    policy.begin_pass(make_view(3))  # request 2 has waited 3 passes: it claims its 13 blocks
    assert policy.guard.claimant == 2
    assert policy.decide(make_request(20, prompt=2, output=1)).verdict is Verdict.DEFER
    policy.release(1)
    policy.begin_pass(make_view(4))
    assert policy.decide(make_request(2, prompt=40, output=10)).is_admit
    assert policy.guard.claimant is None


def test_worst_case_reserves_max_seq_len_per_request():
    policy = WorstCasePolicy(32)
    policy.begin_pass(make_view(0))
    assert policy.decide(make_request(1)).is_admit    # (32 + 1) / 4 = 9 blocks
    assert policy.decide(make_request(2)).is_admit    # 18 <= 19
    assert policy.decide(make_request(3)).verdict is Verdict.DEFER
    assert policy.ledger.total(PoolRole.DRAFT) == 18


def test_joint_admission_secures_the_prompt_only():
    policy = JointAdmissionPolicy()
    policy.begin_pass(make_view(0))
    assert [policy.decide(make_request(r)).verdict for r in range(1, 8)].count(Verdict.ADMIT) == 6  # 3 each


def test_adopts_running_requests_at_its_first_pass_when_installed_mid_run():
    policy = DraftReservePolicy()
    policy.begin_pass(make_view(5, started=[make_request(1, first=False, position=8)]))
    assert policy.ledger.total(PoolRole.DRAFT) == 4 and 1 in policy.ledger


def test_unpaired_draft_only_is_gated_when_the_draft_shares_prefixes():
    from dataclasses import replace

    policy = DraftReservePolicy()
    policy.begin_pass(make_view(0, draft=replace(DRAFT, shares_prefix=True)))
    assert all(policy.decide(make_request(r)).is_admit for r in range(1, 20))
    assert policy.ledger.totals() == {}


def test_registry_lists_the_default_first_and_refuses_unknown_names():
    assert list(POLICIES)[0] == "draft-headroom"
    assert set(POLICIES) == {"draft-headroom", "draft-reserve", "worst-case", "joint-admission"}
    with pytest.raises(ValueError, match="unknown admission policy 'nope'; policies: draft-headroom, draft-reserve"):
        create_policy("nope")
    with pytest.raises(ValueError, match="max_seq_len"):
        create_policy("worst-case")


def test_budget_split_from_kvscope_sizing_keeps_fixed_costs_and_gives_the_draft_its_share():
    from remediation.sizing import BudgetSplit, plan_split, split_bytes

    # glm5-dsa's costs: 49,968 / 1,284 B per token, no fixed cost; 4x the target's tokens for the draft.
    plan = BudgetSplit.parse("4x")
    target, draft = plan(10_000_000_000, (49_968, 0), (1_284, 0))
    reference = plan_split(10_000_000_000, target_bytes_per_token=49_968, draft_bytes_per_token=1_284,
                           tokens_per_block=64, draft_token_ratio=4.0)
    assert (target // 49_968, draft // 1_284) == (reference.target_tokens, reference.draft_tokens)
    assert target + draft == 10_000_000_000
    # Fixed costs stay with their pool; the share applies to what remains.
    assert split_bytes(1_000, (10, 100), (1, 50), draft_byte_share=0.5) == (525, 475)
    assert BudgetSplit.parse("0.09").label == "draft_byte_share_0.09"


@pytest.mark.parametrize("text", ["auto", "1.5", "0", "-2x", "four"])
def test_budget_split_refuses_what_an_engine_at_start_cannot_apply_in_one_line(text):
    from kvscope.app.launcher import sizing_problem
    from remediation.sizing import BudgetSplit

    with pytest.raises(ValueError) as err:
        BudgetSplit.parse(text)
    assert "\n" not in str(err.value)
    problem = sizing_problem(text)
    assert problem is not None and "\n" not in problem
    assert sizing_problem("4x") is None and sizing_problem("0.09") is None and sizing_problem("") is None
