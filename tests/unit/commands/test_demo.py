from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_reproduces_crash_warns_early_and_shows_fixes_survive_when_run(tmp_path):
    # Sessions 1.19 s apart (session_start_interval_s=-1): the failing request is admitted and
    # queued a while before the draft pool refuses it. On the default 10 s ramp the failing request
    # arrives one iteration before the crash, so nothing can name it earlier than that.
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope", "demo", "--json", "--out", str(tmp_path),
         "--set", "session_start_interval_s=-1"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    unpaired, remediated, paired, reuse_off = out["runs"]
    assert out["engine_version"] == "main-00746ef"
    assert [r["engine_version"] for r in out["runs"]] == ["main-00746ef"] * 4
    assert unpaired["engine_fatal"] is True
    assert unpaired["fatal_message"].startswith(
        f"Draft KV cache context resize failed for request {unpaired['fatal_request_id']}: could not resize to"
    )
    assert unpaired["failing_request_named"]["request_id"] == unpaired["fatal_request_id"]
    assert unpaired["failing_request_named"]["lead_iterations"] >= 10
    assert {"admission_gap", "time_to_exhaustion", "engine_fatal"} <= set(unpaired["finding_kinds"])
    for run in (paired, reuse_off):
        assert run["engine_fatal"] is False and run["requests_completed"] > 0
        assert "admission_gap" not in run["finding_kinds"]
    assert (tmp_path / "report.html").stat().st_size > 10_000
    # Remediation on finishes the same traffic with block reuse kept on.
    assert remediated["engine_fatal"] is False and remediated["requests_completed"] > 0
    assert remediated["prefix_hit_rate"] > 0.5
    keys = remediated["remediation"]
    assert keys["requests_contained"] == 0 and keys["reservations_leaked"] == 0 and keys["deferrals"] > 0
    assert (tmp_path / "report-remediated.html").stat().st_size > 10_000


@pytest.mark.slow
def test_a_bad_knob_is_refused_before_any_run_and_given_knobs_are_said_with_every_run(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "kvscope", "demo", "--set", "bogus=1", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and bad.stdout == "" and "unknown knob 'bogus'" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "kvscope", "demo", "--set", "engine_version=1.3.0rc25", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "the demo's run 3 (paired draft (upstream joint reuse)) cannot take it" in bad.stderr
    (tmp_path / "a-file").write_text("")
    for out, why in ((tmp_path / "a-file", "is a file, not a folder"), ("/proc/nope", "cannot create folder")):
        bad = subprocess.run([sys.executable, "-m", "kvscope", "demo", "--out", str(out)],
                             capture_output=True, text=True, timeout=600)
        assert bad.returncode == 2 and bad.stdout == "" and why in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and "Errno" not in bad.stderr
    proc = subprocess.run([sys.executable, "-m", "kvscope", "demo", "--set", "enable_block_reuse=false",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The first line says why the demo runs main-00746ef and how to run the report's build.
    first = proc.stdout.splitlines()[0]
    assert first == ("engine main-00746ef: the newest build read (it has the joint reuse run 3 needs); the report's "
                     "build 1.3.0rc25 is glm5-dsa's default: kvscope replay --scenario glm5-dsa")
    told = first.split(": ")[-1].split()[1:]  # the command it names, shortened to a few requests
    shown = subprocess.run([sys.executable, "-m", "kvscope", *told, "--set", "max_requests=4"],
                           capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0 and shown.stdout.startswith("replay glm5-dsa on engine 1.3.0rc25 ")
    starts = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(starts) == 4 and all(line.endswith("[--set enable_block_reuse=false] ...") for line in starts)
    # each run is described by what it runs: no "reuse on" under a knob that turned it off
    assert all(", reuse off" in line and "reuse on" not in line for line in starts)
    assert starts[1].startswith("[2/4] replaying glm5-dsa: unpaired, reuse off, kvscope remediation on")
    assert "same traffic [--set enable_block_reuse=false]" in proc.stdout
    # Every run gets the same simulated span, so the stock column is not the only one left running.
    served = next(line for line in proc.stdout.splitlines() if "simulated seconds served" in line).split()
    assert served[-2:] == ["600", "600"]


def test_build_line_says_a_build_given_with_set_is_not_the_demos_own():
    from kvscope.commands.demo import _build_line

    assert _build_line("1.3.0rc27").startswith("engine 1.3.0rc27: given with --set; the report's build 1.3.0rc25 ")
    assert "the newest build read" in _build_line("main-00746ef")
