"""Speed work never changes a decision: short replays' decision and summary digests match the fixture.

The fixture (``fixtures/decision_digests.json``) was generated from the engine model before the
per-iteration speed-ups; ``decision_digest.py`` says what is hashed and how to regenerate the fixture
when a decision changes on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from decision_digest import CASES, decision_rows, digest

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "decision_digests.json").read_text())


def test_fixture_covers_every_case_when_loaded():
    assert sorted(FIXTURE) == sorted(name for name, _, _ in CASES)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "scenario", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_replay_decisions_match_the_fixture_when_replayed_again(name, scenario, overrides):
    assert digest(scenario, overrides) == FIXTURE[name]


# Fast-forward exactness, independent of the fixture: a replay that runs every iteration in full
# makes the same decision at every iteration the fast-forwarding replay executes, and ends with the
# same summary (only the count of skipped iterations differs).
FULL_RUN_CASES = [c for c in CASES if c[0] in ("glm5-dsa-64-reuse-off", "glm5-dsa-tight-host-paired",
                                                 "shared-prefix-reuse-off", "near-miss")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "scenario", "overrides"), FULL_RUN_CASES, ids=[c[0] for c in FULL_RUN_CASES])
def test_fast_forward_changes_no_decision_when_compared_with_a_run_of_every_iteration(name, scenario, overrides):
    full_rows, full_summary = decision_rows(scenario, overrides, fast_forward=False)
    rows, summary = decision_rows(scenario, overrides)
    assert full_summary.pop("iterations_fast_forwarded") == 0
    assert summary.pop("iterations_fast_forwarded") > 0
    assert summary == full_summary
    assert len(rows) < len(full_rows)
    assert {i: full_rows.get(i) for i in rows} == rows
