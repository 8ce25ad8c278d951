"""Rank placement: the first PP stage schedules; every stage holds a draft manager (the last one with
the MTP layers), so a draft-pool raise happens on every rank."""

from __future__ import annotations

import pytest

from kvscope.engine_model.ranks import RankLayout, StateKind, StateNotResidentError


def test_every_stage_holds_a_draft_pool_and_only_the_last_the_mtp_layers_when_pp2_tp4():
    layout = RankLayout(pp_size=2, tp_size=4)
    assert layout.world_size == 8
    assert layout.scheduling_ranks == [0, 1, 2, 3]
    assert layout.draft_pool_ranks == list(range(8))
    assert layout.draft_layer_ranks == [4, 5, 6, 7]
    assert layout.holders(StateKind.TARGET_POOL) == list(range(8))
    assert layout.draft_visible_to_scheduler is True
    assert layout.visible_to(0, StateKind.DRAFT_POOL) is True
    assert layout.visible_to(0, StateKind.DRAFT_LAYERS) is False
    assert layout.visible_to(5, StateKind.DRAFT_LAYERS) is True


def test_the_scheduling_rank_cannot_read_the_mtp_layers_when_pipelined():
    layout = RankLayout(pp_size=2, tp_size=4)
    layout.require_visible(0, StateKind.DRAFT_POOL)  # its own replica: no error
    with pytest.raises(StateNotResidentError, match=r"rank 0 does not hold draft_layers; it lives on ranks \[4, 5, 6, 7\]"):
        layout.require_visible(0, StateKind.DRAFT_LAYERS)
    with pytest.raises(StateNotResidentError, match=r"rank 4 does not hold scheduler; it lives on ranks \[0, 1, 2, 3\]"):
        layout.require_visible(4, StateKind.SCHEDULER)


def test_draft_visible_to_scheduler_when_no_pipeline():
    layout = RankLayout(pp_size=1, tp_size=2)
    assert layout.draft_visible_to_scheduler is True
    layout.require_visible(1, StateKind.DRAFT_LAYERS)
    assert layout.raising_ranks(StateKind.DRAFT_POOL) == [0, 1]


def test_draft_raise_happens_on_every_rank_and_kills_every_rank_when_multi_rank():
    layout = RankLayout(pp_size=2, tp_size=4)
    raising = layout.raising_ranks(StateKind.DRAFT_POOL)
    assert raising == list(range(8))
    assert layout.killed_ranks(raising) == list(range(8))
    assert layout.raising_ranks(StateKind.SCHEDULER) == [0, 1, 2, 3]
    assert layout.killed_ranks([]) == []


def test_rejects_layout_when_size_not_positive():
    with pytest.raises(ValueError, match="pp_size and tp_size must be >= 1, got pp=0 tp=4"):
        RankLayout(pp_size=0, tp_size=4)
