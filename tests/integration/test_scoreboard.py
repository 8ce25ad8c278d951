"""The analyzer scoreboard on the short corpus profile (bench/corpus.py SHORT; the full corpus runs
in ``make bench``): every eligible draft-capacity crash gets a warning and a critical finding at
least 10 iterations ahead, no healthy run gets a critical finding, and healthy runs stay under 5
warnings per simulated hour. Labels come from what the engine model did, never from the analyzer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from corpus import SHORT, report, run_corpus  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    return run_corpus(SHORT, tmp_path_factory.mktemp("corpus"))


def test_short_corpus_has_crashes_and_healthy_runs(scores):
    assert len(scores) == len(SHORT)
    assert {s.label.crashed for s in scores} == {True, False}


def test_scoreboard_on_the_short_corpus(scores):
    """Met on the short profile: recall, a warning and a critical finding at least 10 iterations
    ahead of every eligible crash (the rc25 resume-ceiling crashes included), no critical on a
    healthy run (the rc27 reuse-off run whose draft pool passes 95% included), few warnings per
    hour. The full corpus's figures are in bench/bench_scoreboard.py's output."""
    text, boards = report(scores)
    board = boards["all runs"]
    overall = board["detectors"]["overall"]
    assert board["eligible_draft_crashes"] >= 2, text
    assert overall["recall"] == 1.0, text
    assert overall["warning_ahead"] == 1.0, text
    assert overall["healthy_critical"] == 0, text
    assert overall["warnings_per_hour"] <= 5.0, text
    assert board["targets"]["zero_false_critical"] and board["targets"]["warnings_per_hour_le_5"], text
    assert overall["critical_ahead"] == 1.0, text
    assert board["targets"]["critical_ahead_100pct"], text


def test_a_silent_rc27_reuse_off_crash_is_warned_by_its_near_misses_alone(tmp_path):
    """The Mooncake conversation trace on 1.3.0rc27 with reuse off (seed 30, in the full corpus):
    both pools sit at the resume ceiling in step and one pass kills it, so no projection warns it;
    its resumes passing the ceiling by a few blocks do, at least 10 iterations ahead. Never a
    critical: whether the next pass lands one over is not in the events."""
    from corpus import FULL

    (run,) = [r for r in FULL if r.name == "mooncake-trace[enable_block_reuse=false,engine_version=1.3.0rc27,seed=30]"]
    (score,) = run_corpus([run], tmp_path, workers=1)
    assert score.label.crashed and score.label.fatal_pool == "draft"
    assert set(score.first_warning) == {"resume_near_miss", "overall"}
    assert score.first_warning["resume_near_miss"]["lead_iterations"] >= 10
    assert score.first_critical == {}
