"""`kvscope analyze` of a Parquet recording with corrupt row groups (footer intact): a file of which
no event is readable is refused (exit 2, one line naming it), never "holds no events"; one with
some row groups lost is analyzed with an outcome-unknown verdict that says it is damaged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvscope.analysis.incidents import end_missing
from kvscope.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recording"))
from test_damaged_files import corrupt_row_group, make_recording  # noqa: E402


def analyze(capsys, *args):
    code = main(["analyze", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_recording_is_refused_when_its_only_row_group_is_corrupt(tmp_path, fake_clock, monkeypatch, capsys):
    path = make_recording(tmp_path / "only.parquet", fake_clock, row_group_rows=1000, monkeypatch=monkeypatch)
    corrupt_row_group(path, 0)
    for args in ((path, "--json"), (path,)):
        code, out, err = analyze(capsys, *args)
        assert (code, out) == (2, "")
        (line,) = err.strip().splitlines()
        assert line.startswith(f"kvscope analyze: error: {path}: no event readable: all 12 row(s) refused")
        assert "nothing analyzed" in line and "holds no events" not in line


def test_compare_is_refused_when_one_recording_has_no_readable_row_group(tmp_path, fake_clock, monkeypatch, capsys):
    good = make_recording(tmp_path / "good.parquet", fake_clock, monkeypatch=monkeypatch)
    bad = make_recording(tmp_path / "bad.parquet", fake_clock, row_group_rows=1000, monkeypatch=monkeypatch)
    corrupt_row_group(bad, 0)
    code, out, err = analyze(capsys, "--compare", good, bad)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and f"{bad}: no event readable" in err


def test_verdict_says_damaged_not_healthy_when_a_row_group_is_lost(tmp_path, fake_clock, monkeypatch, capsys):
    path = make_recording(tmp_path / "part.parquet", fake_clock, monkeypatch=monkeypatch)
    code, out, _ = analyze(capsys, path, "--json")
    assert code == 0 and json.loads(out)["verdict"]["status"] == "healthy"  # the same run, undamaged
    corrupt_row_group(path, 1)
    code, out, err = analyze(capsys, path, "--json")
    assert code == 1 and "4 unreadable row(s) dropped" in err
    doc = json.loads(out)
    assert doc["num_events"] == 8
    assert doc["verdict"]["status"] == "incomplete"
    assert doc["verdict"]["message"] == f"the recording is damaged: {path} (4 unreadable row(s) dropped)"
    f0 = doc["input"]["files"][0]
    assert (f0["status"], f0["complete"], f0["rows_dropped"]) == ("damaged", False, 4)
    code, out, _ = analyze(capsys, path)
    assert code == 1
    assert out.splitlines()[0] == ("OUTCOME UNKNOWN: no engine failure in the events read, but the recording is "
                                   f"damaged: {path} (4 unreadable row(s) dropped); no findings; unknown build")


def test_end_missing_names_both_the_cut_and_the_damage_when_files_have_both():
    files = [{"path": "r0.parquet", "status": "complete", "rows_dropped": 0},
             {"path": "r1.parquet", "status": "cut off", "rows_dropped": 0},
             {"path": "r2.parquet", "status": "damaged", "rows_dropped": 7}]
    assert end_missing(files[:1]) is None
    assert end_missing(files) == ("the recording is not complete: r1.parquet (cut off); "
                                  "the recording is damaged: r2.parquet (7 unreadable row(s) dropped)")
