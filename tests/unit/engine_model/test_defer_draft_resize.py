"""The #19231-style deferral (open PR, model-only counterfactual ``defer_draft_resize``): the scheduler
sizes the unpaired mirror for each step and defers a request the draft refuses, so no draft resize
raises in ``prepare_resources``; only on the build whose scheduler admits the mirror (main-00746ef)."""

from __future__ import annotations

import pytest

from kvscope import replay
from kvscope.engine_model.config import EngineConfig

MAIN = "engine_version=main-00746ef"


def test_shared_prefix_survives_on_main_when_the_scheduler_defers_a_refused_mirror():
    stock = replay.run("shared-prefix", [MAIN])
    deferred = replay.run("shared-prefix", [MAIN, "defer_draft_resize=true"])
    assert stock.engine_fatal and "context resize failed" in (stock.fatal_message or "")
    assert not deferred.engine_fatal and deferred.requests_completed == deferred.requests_total == 96
    # The draft runs full and stays there: deferral, not luck, kept the engine up.
    assert deferred.peak_utilization["draft"] > 0.99


@pytest.mark.slow
def test_qwen_hybrid_survives_its_generation_growth_when_deferred():
    summary = replay.run("qwen-hybrid-mtp", [MAIN, "defer_draft_resize=true"])
    assert not summary.engine_fatal and summary.requests_completed == 24


def test_deferral_is_refused_on_a_build_without_scheduler_side_mirror_admission():
    with pytest.raises(ValueError, match=r"defer_draft_resize \(PR #19231\) .* engine_version 1\.3\.0rc25"):
        EngineConfig(engine_version="1.3.0rc25", defer_draft_resize=True)
