"""`kvscope analyze`: one JSON object with the public keys; HTML report with lead times."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from analysis_script import crash_script

from kvscope.recording import BatchPump, ParquetSink


def _write(tmp_path, meta=None, **kwargs):
    script, facts = crash_script(**kwargs)
    path = tmp_path / "events.parquet"
    pump = BatchPump(script.rec, [ParquetSink(path, meta=meta or {"scenario": "hand-built"})], start=False)
    pump.shutdown()
    return path, facts


def _kvscope(*args):
    return subprocess.run([sys.executable, "-m", "kvscope", "analyze", *args], capture_output=True, text=True)


def test_json_prints_one_object_with_findings_when_events_crash(tmp_path):
    path, facts = _write(tmp_path)
    res = _kvscope(str(path), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert list(out)[:2] == ["verdict", "counts"]  # the object leads with the verdict, as the reports do
    assert out["scenario"] == "hand-built"
    kinds = [f["kind"] for f in out["findings"]]
    # criticals first, each severity in time order
    assert kinds == ["admission_gap", "time_to_exhaustion", "engine_fatal", "reuse_loss"]
    gap = out["findings"][0]
    assert gap["request_ids"] == [2] and gap["pools"] == ["draft"] and gap["severity"] == "critical"
    fatal = out["findings"][2]
    assert gap["t_start_s"] < fatal["t_start_s"]
    assert fatal["evidence"]["lead_iterations"] == facts["fatal_iteration"] - facts["admit_iteration"]
    assert out["verdict"]["status"] == "engine_fatal" and out["verdict"]["request_id"] == fatal["request_ids"][0]
    assert out["verdict"]["first_critical"]["kind"] == "admission_gap"
    assert out["counts"]["by_kind"]["admission_gap"] == 1


def test_html_report_shows_lead_time_and_figures(tmp_path):
    path, _ = _write(tmp_path)
    report = tmp_path / "r.html"
    res = _kvscope(str(path), "--json", "--html", str(report))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["html"] == str(report)
    text = report.read_text()
    assert "24 it / 0.240 s before the failure (names the failing request 24 it before)" in text
    assert "request first named 24 it earlier (admission_gap)" in text
    assert text.count("plotly-graph-div") >= 3


def test_html_report_of_a_real_clock_recording_labels_its_axes_with_the_wall_clock(tmp_path):
    # A real clock's seconds count from the host's boot (19372.1 s): the report's axes read
    # '19.37211k' unless labelled with the time of day, as the dashboard's are.
    from pathlib import Path

    path = Path(__file__).parent / "data" / "real-clock-arrivals-first.parquet"
    report = tmp_path / "r.html"
    res = _kvscope(str(path), "--html", str(report))
    assert res.returncode == 0, res.stderr
    assert "2026-12-04 07:46:58 UTC" in res.stdout  # the verdict's own reading of the same clock
    text = report.read_text()
    assert text.count('"title":{"text":"time (UTC, wall clock)"}') == 3  # pool usage, debt, timeline
    ticks = re.findall(r'"ticktext":\[([^]]*)\]', text)
    assert len(ticks) == 3 and all(t.startswith('"07:46:58.') for t in ticks)


def test_missing_file_exits_nonzero_with_one_line(tmp_path):
    res = _kvscope(str(tmp_path / "nope.parquet"), "--json")
    assert res.returncode == 2
    assert res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1


def test_compare_text_gives_every_run_its_verdict_line_then_its_findings():
    from pathlib import Path

    data = Path(__file__).parent / "data"
    crash, healthy = str(data / "glm5-dsa.parquet"), str(data / "glm5-dsa-rc27-reuse-off.parquet")
    res = _kvscope(crash, healthy, "--compare")
    assert res.returncode == 0, res.stderr
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        with_html = _kvscope(crash, healthy, "--compare", "--html", f"{tmp}/r.html").stdout.splitlines()
    assert [line for line in with_html if line.startswith("report:")] == [f"report: {tmp}/r.html"]  # one report
    lines = res.stdout.splitlines()
    # Each run is labelled by its file, scenario, build and the knobs that differ between the runs.
    crash_label = f"{crash} (glm5-dsa on engine model-of-main-00746ef, enable_block_reuse=true, "
    healthy_label = f"{healthy} (glm5-dsa on engine model-of-1.3.0rc27, enable_block_reuse=false, "
    assert lines[0].startswith(crash_label) and "): ENGINE FATAL" in lines[0]
    assert lines[1].startswith(healthy_label) and "): HEALTHY" in lines[1]
    heads = [i for i, line in enumerate(lines) if line.startswith("== ")]
    assert [lines[i][3:].split(" (")[0] for i in heads] == [crash, healthy]
    assert lines[heads[0]][3:] == lines[0].split("): ")[0] + ")"  # the same label as the verdict line's
    assert heads[1] > heads[0] + 2  # the first run's findings in between


@pytest.mark.slow
def test_a_healthy_auto_run_says_which_finding_switched_remediation_on(tmp_path):
    events = tmp_path / "auto.parquet"
    # The twelve warm-ups sent at once (warmup_concurrency=0): a finding comes early enough for auto
    # to switch on and the run ends healthy.
    res = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "qwen-hybrid-mtp", "--remediation",
                          "auto", "--set", "warmup_concurrency=0", "--events", str(events), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-1000:]
    assert json.loads(res.stdout)["engine_fatal"] is False
    res = _kvscope(str(events), "--json", "--html", str(tmp_path / "r.html"))
    verdict = json.loads(res.stdout)["verdict"]
    trig = verdict["remediation_triggered"]
    assert verdict["status"] == "healthy" and trig["trigger"].endswith("finding") and trig["iteration"] >= 0
    text = _kvscope(str(events)).stdout.splitlines()[0]
    assert text.endswith(f"; remediation (auto) switched on at iteration {trig['iteration']}, triggered by "
                         f"{trig['trigger']}; engine model-of-1.3.0rc27")  # the build last
    assert "Remediation (auto) switched on at iteration" in (tmp_path / "r.html").read_text()


def test_verdict_line_json_and_html_header_name_the_engine_build_of_the_header(tmp_path):
    meta = {"scenario": "hand-built", "engine": "tensorrt_llm", "engine_version": "1.3.0rc25"}
    path, _ = _write(tmp_path, meta=meta)
    first = _kvscope(str(path), "--html", str(tmp_path / "r.html")).stdout.splitlines()[0]
    assert first.startswith("ENGINE FATAL at ") and first.endswith("; engine 1.3.0rc25")  # the verdict leads
    out = json.loads(_kvscope(str(path), "--json").stdout)
    assert (out["engine"], out["engine_version"]) == ("tensorrt_llm", "1.3.0rc25")
    assert "engine tensorrt_llm, build 1.3.0rc25 · " in (tmp_path / "r.html").read_text()


def test_verdict_line_json_and_html_header_say_unknown_build_when_the_header_names_none(tmp_path):
    path, _ = _write(tmp_path)  # meta: the scenario only
    first = _kvscope(str(path), "--html", str(tmp_path / "r.html")).stdout.splitlines()[0]
    assert first.startswith("ENGINE FATAL at ") and first.endswith("; unknown build")
    out = json.loads(_kvscope(str(path), "--json").stdout)
    assert "engine_version" in out and out["engine_version"] is None
    assert "engine unknown, unknown build · " in (tmp_path / "r.html").read_text()


@pytest.mark.slow
def test_compare_labels_runs_by_scenario_build_and_the_knobs_that_differ(tmp_path):
    runs = {"rc25": ["engine_version=1.3.0rc25"], "main": ["engine_version=main", "enable_block_reuse=false"]}
    for name, knobs in runs.items():
        res = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "oversize", "--json",
                              "--events", str(tmp_path / f"{name}.jsonl"), *[a for k in knobs for a in ("--set", k)]],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-1000:]
    rc25, main = str(tmp_path / "rc25.jsonl"), str(tmp_path / "main.jsonl")
    labels = [f"{rc25} (oversize on engine model-of-1.3.0rc25, enable_block_reuse=true)",
              f"{main} (oversize on engine model-of-main-00746ef, enable_block_reuse=false)"]
    lines = _kvscope(rc25, main, "--compare").stdout.splitlines()
    assert lines[0].startswith(f"{labels[0]}: HEALTHY: no engine failure")
    assert lines[1].startswith(f"{labels[1]}: HEALTHY: no engine failure")
    assert [line[3:] for line in lines if line.startswith("== ")] == labels
    res = _kvscope(rc25, main, "--compare", "--json", "--html", str(tmp_path / "r.html"))
    out = json.loads(res.stdout)
    assert out["engine_version"] == "model-of-1.3.0rc25"  # the first run's, as the rest of the object
    assert [(r["file"], r["label"], r["scenario"], r["engine_version"]) for r in out["runs"]] == [
        (rc25, labels[0], "oversize", "model-of-1.3.0rc25"), (main, labels[1], "oversize", "model-of-main-00746ef")]
    page = (tmp_path / "r.html").read_text()
    assert "<tr><td>rc25.jsonl (oversize on engine model-of-1.3.0rc25, enable_block_reuse=true)</td>" in page
    assert "<tr><td>main.jsonl (oversize on engine model-of-main-00746ef, enable_block_reuse=false)</td>" in page
