"""``kvscope analyze`` never passes broken or unrelated input off as a clean run.

Every bad input: one line on stderr naming the file (and row/field), exit 2, nothing on stdout.
Partial input: analyzed, ``--json`` ``input`` says what is missing, exit 1.
"""

from __future__ import annotations

import json

import pytest

from kvscope.cli import main
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder, sink_for_path


def record(path, clock, *, rank=0, meta=None, n=12, status="complete", pid=None):
    rec = Recorder(clock=clock, rank=rank, pid=pid)
    for i in range(n):
        rec.iteration = i
        rec.record(EventKind.ADMITTED, i, PoolRole.TARGET, 1, 64, 1, capacity_blocks=100,
                   free_blocks=99, evictable_blocks=0, reserved_blocks=0)
        clock.advance(1_000_000)
    meta = {"run_id": "run-a", "scenario": "unit", **(meta or {})}
    BatchPump(rec, [sink_for_path(path, meta=meta)], start=False, max_batch=4).shutdown(status=status)
    return path


def analyze(capsys, *args):
    code = main(["analyze", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args):
    code, out, err = analyze(capsys, *args, "--json")
    assert code == 2, (out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_truncated_file_is_refused_with_its_name_when_analyzed(tmp_path, fake_clock, suffix, capsys):
    path = record(tmp_path / f"t{suffix}", fake_clock)
    data = path.read_bytes()
    if suffix == ".jsonl":
        path.write_bytes(data[: data.index(b"\n") // 2])  # header cut in half
    else:
        path.write_bytes(data[: len(data) // 2])
    line = refused(capsys, path)
    assert str(path) in line


@pytest.mark.parametrize("content", [b"", b"garbage\nmore garbage\n", b"PAR1garbagePAR1", b"\x00" * 64,
                                     b'{"format": "something-else"}\n'])
@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_empty_corrupt_or_foreign_file_is_refused_when_analyzed(tmp_path, content, suffix, capsys):
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(content)
    assert str(path) in refused(capsys, path)


def test_unknown_schema_version_is_refused_naming_the_field_when_analyzed(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "v.jsonl", fake_clock)
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["schema_version"] = 99
    path.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    line = refused(capsys, path)
    assert "schema_version" in line and "99" in line


def test_directory_is_refused_when_analyzed(tmp_path, capsys):
    (tmp_path / "d.parquet").mkdir()
    assert "is a directory" in refused(capsys, tmp_path / "d.parquet")
    assert "is a directory" in refused(capsys, tmp_path)


def test_one_bad_rank_refuses_the_whole_analysis_when_files_are_merged(tmp_path, fake_clock, capsys):
    good = record(tmp_path / "r0.parquet", fake_clock, rank=0)
    bad = record(tmp_path / "r1.parquet", fake_clock, rank=1)
    bad.write_bytes(bad.read_bytes()[:100])
    line = refused(capsys, good, bad)
    assert str(bad) in line


def test_rows_dropped_for_bad_fields_are_reported_in_json_when_analyzed(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "b.jsonl", fake_clock)
    lines = path.read_text().splitlines()
    obj = json.loads(lines[3])
    obj["num_blocks"] = 2**70  # out of range for int64
    lines[3] = json.dumps(obj)
    obj = json.loads(lines[5])
    obj["kind"] = "no_such_kind"
    lines[5] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")
    code, out, err = analyze(capsys, path, "--json")
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "row 2 (line 4), field 'num_blocks'" in err
    doc = json.loads(out)
    assert doc["num_events"] == 10
    assert doc["input"]["rows_dropped"] == 2 and doc["input"]["complete"] is False
    assert doc["input"]["files"][0]["rows_dropped"] == 2


def test_clean_file_is_a_clean_run_with_input_facts_when_analyzed(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "ok.parquet", fake_clock)
    code, out, err = analyze(capsys, path, "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["input"]["complete"] is True and doc["input"]["interrupted"] is False
    assert doc["input"]["files"][0]["status"] == "complete"
    assert doc["verdict"]["status"] == "healthy"


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_interrupted_recording_is_reported_not_clean_when_analyzed(tmp_path, fake_clock, suffix, capsys):
    path = record(tmp_path / f"i{suffix}", fake_clock, status="interrupted")
    code, out, err = analyze(capsys, path, "--json")
    assert code == 1 and "interrupted" in err
    doc = json.loads(out)
    assert doc["input"]["interrupted"] is True and doc["input"]["files"][0]["status"] == "interrupted"
    assert doc["num_events"] == 12
    # no failure in what was read is not health: the run's end is missing
    assert doc["verdict"]["status"] == "incomplete" and str(path) in doc["verdict"]["message"]
    code, out, err = analyze(capsys, path)
    assert code == 1 and out.startswith("OUTCOME UNKNOWN: no engine failure in the events read, but the recording "
                                        f"is not complete: {path} (interrupted)")
    html = tmp_path / "r.html"
    assert analyze(capsys, path, "--html", html)[0] == 1
    text = html.read_text(encoding="utf-8")
    assert "OUTCOME UNKNOWN" in text and "HEALTHY" not in text


def test_missing_file_names_the_partial_beside_it_when_analyzed(tmp_path, fake_clock, capsys):
    path = tmp_path / "killed.parquet"
    assert refused(capsys, path) == f"kvscope analyze: error: {path}: no such event file"
    # A recording killed before it closed: only its .partial stream is on disk.
    rec = Recorder(clock=fake_clock)
    rec.record(EventKind.ADMITTED, 0, PoolRole.TARGET, 1, 64, 1)
    sink = sink_for_path(path, meta={"run_id": "run-a"})
    BatchPump(rec, [sink], start=False).flush()
    sink.flush()
    assert not path.exists()
    assert refused(capsys, path) == (f"kvscope analyze: error: {path}: no such event file; {path}.partial is beside "
                                     "it (an unfinished recording): give that file instead")
    code, out, err = analyze(capsys, f"{path}.partial", "--json")
    assert code == 1 and json.loads(out)["num_events"] == 1  # and it is readable, as said


def test_same_file_twice_is_refused_when_analyzed(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "a.parquet", fake_clock)
    assert "given twice" in refused(capsys, path, path)
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(path.read_bytes())
    assert "both the recording of rank 0" in refused(capsys, path, copy)


def test_same_file_twice_is_refused_when_compared(tmp_path, fake_clock, capsys):
    # --compare loads each file as its own run, so the merge's check never sees the pair.
    path = record(tmp_path / "a.parquet", fake_clock)
    link = tmp_path / "link.parquet"
    link.symlink_to(path)
    assert "given twice" in refused(capsys, "--compare", path, link)
    other = record(tmp_path / "b.parquet", fake_clock, meta={"run_id": "run-b"})
    code, out, _err = analyze(capsys, "--compare", path, other, "--json")
    assert code == 0 and [r["file"] for r in json.loads(out)["runs"]] == [str(path), str(other)]


@pytest.mark.parametrize("flag", ["--stall-min-s", "--risk-horizon-s"])
@pytest.mark.parametrize("value", ["nan", "inf", "-5"])
def test_a_threshold_that_is_no_finite_positive_number_is_refused_by_its_flag(tmp_path, fake_clock, capsys,
                                                                              flag, value):
    # A NaN passes every range check (it compares false): --stall-min-s nan removed every stall finding.
    path = record(tmp_path / "a.parquet", fake_clock)
    line = refused(capsys, path, flag, value)
    assert line.startswith(f"kvscope analyze: error: {flag} must be")


def test_three_different_runs_are_refused_when_analyzed(tmp_path, fake_clock, capsys):
    paths = [record(tmp_path / f"run{i}.parquet", fake_clock, meta={"run_id": f"r{i}"}) for i in range(3)]
    line = refused(capsys, *paths)
    assert "3 different runs" in line and all(str(p) in line for p in paths)


def test_two_scenarios_without_run_ids_are_refused_when_analyzed(tmp_path, fake_clock, capsys):
    a = record(tmp_path / "a.jsonl", fake_clock, meta={"run_id": None, "scenario": "near-miss"})
    b = record(tmp_path / "b.jsonl", fake_clock, meta={"run_id": None, "scenario": "shared-prefix"}, rank=1)
    line = refused(capsys, a, b)
    assert "2 different runs" in line and "near-miss" in line and "shared-prefix" in line


def test_ranks_of_one_run_merge_when_analyzed(tmp_path, fake_clock, capsys):
    a = record(tmp_path / "r0.parquet", fake_clock, rank=0, pid=10)
    b = record(tmp_path / "r1.jsonl", fake_clock, rank=1, pid=11)
    code, out, _ = analyze(capsys, a, b, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["num_events"] == 24 and [f["rank"] for f in doc["input"]["files"]] == [0, 1]
    # The ranks replicate their pools: each pool is analyzed from one rank.
    assert doc["ranks"]["recorded"] == [0, 1] and doc["ranks"]["num_events_analyzed"] == 12


def test_html_report_to_a_directory_is_refused_before_reading_when_analyzed(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "ok.parquet", fake_clock)
    line = refused(capsys, path, "--html", tmp_path)
    assert "is a directory" in line


def test_export_refuses_one_file_twice_and_directories_before_exporting(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "a.parquet", fake_clock)
    for argv in ([path, path], [tmp_path]):
        code = main(["export", *map(str, argv), "--otlp-endpoint", "http://127.0.0.1:9", "--timeout", "0.1"])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "given twice" in err or "is a directory" in err


def test_export_takes_partial_input_as_analyze_does_and_says_so_in_one_line_per_problem(tmp_path, fake_clock,
                                                                                         capsys):
    path = record(tmp_path / "cut.jsonl", fake_clock, n=40)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # cut mid-line, no end record
    code = main(["export", str(path), "--otlp-endpoint", "http://127.0.0.1:9", "--timeout", "0.1", "--json"])
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["files"][0]["complete"] is False and summary["events"] > 0
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"kvscope export: warning: {path}: partial input: recording not complete")
    # The collector is down too, so nothing was exported: kvscope's own error line says so (exit 2),
    # and the SDK's retry messages do not reach the terminal.
    assert len(lines) == 2 and lines[1] == f"kvscope export: error: {summary['error']}" and code == 2
    assert "cannot reach collector http://127.0.0.1:9 (grpc: connection refused" in lines[1]
    assert summary["exported_total"] == 0 and summary["dropped_total"] > 0


def test_export_refuses_an_endpoint_no_exporter_could_reach(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "ok.parquet", fake_clock)
    for endpoint in ("notaurl", "ftp://collector:4317", "http://collector:99999"):
        code = main(["export", str(path), "--otlp-endpoint", endpoint])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and repr(endpoint) in err


def test_a_recording_on_the_monotonic_clock_anchors_its_times_to_the_wall_clock_once(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "real.parquet", fake_clock)  # the Recorder's default clock: monotonic
    code, out, _ = analyze(capsys, path)
    lines = out.splitlines()
    assert code == 0 and sum(line.startswith("times below: the recording's monotonic clock") for line in lines) == 1
    assert lines[2].endswith(" UTC")


def test_export_of_a_file_unreadable_as_a_whole_says_nothing_was_exported(tmp_path, fake_clock, capsys):
    path = record(tmp_path / "t.parquet", fake_clock)
    path.write_bytes(path.read_bytes()[:200])
    code = main(["export", str(path), "--otlp-endpoint", "http://127.0.0.1:9"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.strip().endswith("; nothing exported") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_recording_with_no_events_is_no_verdict_of_health(tmp_path, fake_clock, suffix, capsys):
    # An engine that fails during start-up after loading kvscope leaves a header and an end record:
    # a complete file holding nothing. It is not a healthy run (an on-call walkthrough got HEALTHY,
    # exit 0, from analyze and export both).
    path = record(tmp_path / f"zero{suffix}", fake_clock, n=0)
    code, out, err = analyze(capsys, path, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["num_events"] == 0
    assert doc["verdict"]["status"] == "incomplete" and "holds no events" in doc["verdict"]["message"]
    assert doc["input"]["complete"] is False and doc["input"]["empty"] is True
    assert err.strip() == (f"kvscope analyze: warning: no events in {path}: the engine recorded nothing (it may have "
                           "failed before its first scheduler pass)")
    code, out, _ = analyze(capsys, path)
    assert code == 1 and out.startswith("OUTCOME UNKNOWN: no engine failure in the events read, but the recording "
                                        "holds no events")
    code = main(["export", str(path), "--otlp-endpoint", "http://127.0.0.1:9", "--timeout", "0.1", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and json.loads(out)["events"] == 0
    assert err.strip().splitlines()[0] == f"kvscope export: warning: no events in {path}: the engine recorded " \
                                          "nothing (it may have failed before its first scheduler pass)"
