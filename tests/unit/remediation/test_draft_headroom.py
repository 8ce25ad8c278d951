"""The default policy, ``draft-headroom``: admit on the prompt, follow decode growth, hold what cannot fit.

DRAFT_HOST: 20 blocks of 4 tokens, 1 draft slot, resume ceiling 0.95 -> 19 usable blocks, a host tier
below. A request of prompt 10 takes blocks_for_tokens(10) = ceil((10 + 1) / 4) = 3 blocks at admission.
"""

from __future__ import annotations

import dataclasses

from remediation_helpers import DRAFT, make_view

from kvscope.events import PoolRole
from kvscope.port import AdmissionRequest, PassView, Verdict
from remediation.policies import DEFAULT_POLICY, POLICIES, DraftHeadroomPolicy

DRAFT_HOST = dataclasses.replace(DRAFT, has_tier_below=True)


def view(iteration: int = 0, *, draft=DRAFT_HOST, running: int = 0) -> PassView:
    return dataclasses.replace(make_view(iteration, draft=draft), num_running=running)


def request(rid: int, prompt: int = 10, cap: int = 60, *, tokens: int = -1, first: bool = True) -> AdmissionRequest:
    return AdmissionRequest(rid, prompt, cap, 0, first, 1, num_tokens=tokens)


def admitted(policy: DraftHeadroomPolicy, *rids: int, prompt: int = 10) -> None:
    for rid in rids:
        assert policy.decide(request(rid, prompt)).is_admit


def test_it_is_the_default_policy():
    assert DEFAULT_POLICY == DraftHeadroomPolicy.name
    assert list(POLICIES)[0] == DEFAULT_POLICY


def test_admits_on_the_prompt_not_the_clients_cap_when_a_host_tier_lies_below():
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view())
    # Reserving the cap (60 tokens: 18 blocks each) would admit one request; the prompt admits six.
    admitted(policy, 1, 2, 3, 4, 5, 6)
    assert policy.ledger.total(PoolRole.DRAFT) == 18
    assert policy.decide(request(7)).verdict is Verdict.DEFER  # 18 + 3 > 19


def test_leaves_one_block_per_running_request_for_their_next_step():
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view(running=0))
    admitted(policy, 1, 2, 3, 4, 5)  # 15 blocks
    policy.begin_pass(view(1, running=5))
    assert policy.decide(request(6)).verdict is Verdict.DEFER  # 15 + 3 + 5 headroom > 19
    policy.begin_pass(view(2, running=1))
    assert policy.decide(request(6)).is_admit  # 15 + 3 + 1 <= 19


def test_a_step_claims_the_block_it_grows_into_and_is_held_when_the_pool_is_full():
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view())
    admitted(policy, 1, 2, 3, 4, 5, 6)  # 18 of 20 blocks (19 below the resume ceiling)
    assert policy.allow_growth(1, 11)  # 11 + 1 + 1 draft = 13 tokens -> 4 blocks: grows 1
    assert policy.allow_growth(1, 12)  # still 4 blocks: nothing to claim
    # An active mirror grows past the resume ceiling (only a resume is gated by it), up to the pool's end.
    assert policy.allow_growth(2, 11)
    assert policy.ledger.total(PoolRole.DRAFT) == 20
    assert not policy.allow_growth(3, 11)  # would be the 21st block of 20
    assert policy.num_steps_held == 1
    assert policy.ledger.total(PoolRole.DRAFT) == 20  # a held step claims nothing


def test_a_resume_needs_the_pool_at_or_below_its_ceiling_and_room_for_it():
    pool = dataclasses.replace(DRAFT_HOST, capacity_blocks=40)  # 38 blocks below the 0.95 ceiling
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view(draft=pool))
    admitted(policy, *range(1, 13))  # 12 x 3 = 36 blocks
    assert policy.decide(request(13, prompt=1, cap=1)).is_admit  # 1 block: 37
    policy.suspended(13)  # above a host tier: its block leaves the GPU (36)
    assert policy.allow_growth(1, 22)  # request 1 grows to 6 blocks: 39, past the ceiling
    assert not policy.allow_growth(13, 1)  # 39 + 1 fits the pool, but 39 > 38: no resume
    policy.release(2)  # 36 again
    assert policy.allow_growth(13, 1)
    assert policy.ledger.held(13)[PoolRole.DRAFT].num_blocks == 1


def test_a_step_is_counted_but_never_held_when_not_enforcing():
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view())
    admitted(policy, 1, 2, 3, 4, 5, 6)
    assert policy.allow_growth(1, 11) and policy.allow_growth(2, 11)
    # Shadow: the step does not fit (the answer says so), but the engine takes it, so it is counted.
    assert not policy.allow_growth(3, 11, enforce=False)
    assert policy.ledger.total(PoolRole.DRAFT) == 21 and policy.num_steps_held == 0


def test_a_suspension_frees_the_ledger_only_where_a_tier_lies_below_and_the_resume_must_fit_again():
    with_tier, without = DraftHeadroomPolicy(), DraftHeadroomPolicy()
    with_tier.begin_pass(view())
    without.begin_pass(view(draft=DRAFT))
    admitted(with_tier, 1, 2)
    for rid in (1, 2):  # without a tier the cap is secured too: (6 + 6 + 1) / 4 = 4 blocks each
        assert without.decide(request(rid, prompt=6, cap=6)).is_admit
    with_tier.suspended(1)
    without.suspended(1)
    assert with_tier.ledger.total(PoolRole.DRAFT) == 3  # request 1's pages went to the host tier
    assert without.ledger.total(PoolRole.DRAFT) == 8  # a suspended mirror's pages stay on the GPU
    # The resume is a step like any other: it claims the request's whole footprint again.
    assert with_tier.allow_growth(1, 10)
    assert with_tier.ledger.held(1)[PoolRole.DRAFT].num_blocks == 3


def test_freed_caches_leave_the_ledger_and_the_request_is_admitted_again_on_what_it_needs():
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view(draft=DRAFT))
    assert policy.decide(request(1, prompt=10, cap=5)).is_admit
    policy.suspended(1, freed=True)  # a recompute pause frees both pools
    assert policy.ledger.total(PoolRole.DRAFT) == 0
    # It comes back as context (prompt + what it generated) and must fit like a new request.
    assert policy.decide(request(1, prompt=14, cap=1, first=False)).is_admit
    assert policy.ledger.held(1)[PoolRole.DRAFT].num_blocks == 4  # (14 + 1 + 1) / 4


def test_secures_the_clients_cap_where_no_tier_lies_below():
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view(draft=DRAFT))
    assert policy.decide(request(1, prompt=10, cap=5)).is_admit  # (10 + 5 + 1) / 4 = 4 blocks
    assert policy.ledger.total(PoolRole.DRAFT) == 4


def test_decode_rounds_allowed_bounds_a_stretch_to_what_every_request_can_grow_into():
    policy = DraftHeadroomPolicy()
    policy.begin_pass(view())
    admitted(policy, 1, 2)  # 6 of 20 blocks: 14 free, 2 held back for block boundaries
    # (14 - 2) blocks x 4 tokens / 2 requests = 24 tokens each; 2 tokens per round (1 + 1 draft).
    assert policy.decode_rounds_allowed() == 12
    admitted(policy, 3, 4, 5, 6)  # 18 of 20: 2 free, 6 held back
    assert policy.decode_rounds_allowed() == 0


def test_a_draft_kept_in_step_is_gated_unless_the_scheduler_also_defers_a_refused_resume():
    # Reuse off: the target reserves what each mirror asks, first, so a draft with the target's tokens
    # cannot run out before it; where the scheduler defers a refused resume too (main-00746ef's
    # admit_mirror) nothing in it can raise and gating would only cost throughput. Elsewhere a
    # resume after the pass's context mirrors can still meet the ceiling, and a smaller draft can run out.
    no_reuse_target = dataclasses.replace(make_view().pools[PoolRole.TARGET], shares_prefix=False, capacity_blocks=20)
    for draft, gated in ((dataclasses.replace(DRAFT_HOST, resume_deferred=True), False),
                         (DRAFT_HOST, True),
                         (dataclasses.replace(DRAFT_HOST, resume_deferred=True, capacity_blocks=19), True)):
        policy = DraftHeadroomPolicy()
        policy.begin_pass(PassView(0, {PoolRole.TARGET: no_reuse_target, PoolRole.DRAFT: draft}))
        verdicts = {policy.decide(request(rid)).verdict for rid in range(1, 12)}  # 11 x 3 = 33 blocks asked
        assert (Verdict.DEFER in verdicts) is gated
