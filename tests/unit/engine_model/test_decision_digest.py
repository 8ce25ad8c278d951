"""Speed work never changes a decision: short replays' decision and summary digests match the fixture.

The fixture (``fixtures/decision_digests.json``) was generated from the engine model before the
per-iteration speed-ups; ``decision_digest.py`` says what is hashed and how to regenerate the fixture
when a decision changes on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from decision_digest import CASES, digest

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "decision_digests.json").read_text())


def test_fixture_covers_every_case_when_loaded():
    assert sorted(FIXTURE) == sorted(name for name, _, _ in CASES)


@pytest.mark.parametrize(("name", "scenario", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_replay_decisions_match_the_fixture_when_replayed_again(name, scenario, overrides):
    assert digest(scenario, overrides) == FIXTURE[name]
