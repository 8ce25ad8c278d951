"""bench/twins.py on a real crash of the silent family (the Mooncake conversation trace on
1.3.0rc27 with reuse off, seed 30): the twin harness reproduces the crash unchanged, finds a twin
whose recording is the crash's row for row up to 10 iterations before the failure and which stays
healthy, and its prefix comparison does see a change made before the cut.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from corpus import FULL  # noqa: E402
from twins import MIN_LEAD, Twin, replay_twin, same_prefix, study  # noqa: E402

from kvscope.analysis import analyze_files  # noqa: E402
from kvscope.analysis.findings import Severity  # noqa: E402

pytestmark = pytest.mark.slow

RUN = next(r for r in FULL if r.name == "mooncake-trace[enable_block_reuse=false,engine_version=1.3.0rc27,seed=30]")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("twins")
    return study(RUN, out, candidates=3, eos_alone=False), out


def test_the_identity_twin_reproduces_the_crash(result):
    res, _out = result
    assert res.identity_ok, res.note
    assert res.cut == res.fatal_iteration - MIN_LEAD
    identity = res.tried[0]
    assert identity["twin"] == "identity" and identity["crashed"] and identity["same_prefix"]


def test_a_healthy_twin_shares_the_crash_recording_up_to_the_cut(result):
    res, _out = result
    assert res.healthy_twin is not None, res.tried
    assert res.prefix_rows > 0
    assert res.twin_summary["requests_failed"] == 0 and res.twin_summary["requests_completed"] > 0
    healthy = next(t for t in res.tried if t["twin"] == res.healthy_twin)
    assert healthy["same_prefix"] and not healthy["crashed"]
    # The twin's own findings: whatever a rule said by the cut it said on both runs; the healthy
    # twin has no critical finding (the scoreboard's other target).
    assert not any(f.severity == Severity.CRITICAL for f in analyze_files(res.twin_path).findings)
    assert res.twin_critical is False


def test_the_prefix_comparison_sees_a_change_before_the_cut(result, tmp_path):
    res, out = result
    original = next(p for p in out.glob("*.parquet") if ".twin-" not in p.name)
    # Every running request ending 50 iterations before the cut changes what was recorded by then.
    early = tmp_path / "early.parquet"
    replay_twin(RUN, Twin(res.cut - 50, eos_all=True), None, early)
    same, why = same_prefix(original, early, res.cut)
    assert not same, why


def test_the_corpus_twin_spec_is_read_and_checked():
    from twins import parse_twin

    assert parse_twin("cut=6403,eos=342") == Twin(6403, eos=(342,))
    assert parse_twin("cut=10,eos=1+2") == Twin(10, eos=(1, 2))
    assert parse_twin("cut=10,eos=all") == Twin(10, eos_all=True)
    with pytest.raises(ValueError, match="expected cut=N,eos="):
        parse_twin("cut=10,stop=1")
