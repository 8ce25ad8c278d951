"""Rank placement: first PP stage schedules, last PP stage holds the draft and raises."""

from __future__ import annotations

import pytest

from kvscope.engine_model.ranks import RankLayout, StateKind


def test_draft_lives_on_last_stage_when_pp2_tp4():
    layout = RankLayout(pp_size=2, tp_size=4)
    assert layout.world_size == 8
    assert layout.scheduling_ranks == [0, 1, 2, 3]
    assert layout.draft_pool_ranks == [4, 5, 6, 7]
    assert layout.holders(StateKind.TARGET_POOL) == list(range(8))
    assert layout.draft_visible_to_scheduler is False
    assert layout.visible_to(0, StateKind.DRAFT_POOL) is False
    assert layout.visible_to(5, StateKind.DRAFT_POOL) is True


def test_draft_visible_to_scheduler_when_no_pipeline():
    layout = RankLayout(pp_size=1, tp_size=2)
    assert layout.draft_visible_to_scheduler is True
    assert layout.raising_ranks(StateKind.DRAFT_POOL) == [0, 1]


def test_draft_raise_kills_every_rank_when_multi_rank():
    layout = RankLayout(pp_size=2, tp_size=4)
    raising = layout.raising_ranks(StateKind.DRAFT_POOL)
    assert raising == [4, 5, 6, 7]
    assert layout.killed_ranks(raising) == list(range(8))
    assert layout.killed_ranks([]) == []


def test_rejects_layout_when_size_not_positive():
    with pytest.raises(ValueError, match="pp_size and tp_size must be >= 1, got pp=0 tp=4"):
        RankLayout(pp_size=0, tp_size=4)
