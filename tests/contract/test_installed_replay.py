"""``kvscope replay --scheduler installed --manager installed`` against a stand-in laid out like TensorRT-LLM.

The stand-in (``standin_trtllm/``) puts kvscope's own small classes at the real module paths, with the
seam record's signatures and the real constructors' parameters; each is a thin subclass of the
engine model's, so a replay through them must decide exactly as the model's own replay does. What is
checked here is the path a user's installed build takes: found, checked against the seam record,
built from real-shaped arguments (the manager on kvscope's accounting-only driver stand-in, as on a
machine without a GPU), run in the model's executor loop and hooked through the seams, with the same
outcome, events and analysis as the model. Every replay runs in a child interpreter, so the stand-in
never leaks into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parent / "standin_trtllm"
SCENARIO = "shared-prefix"
# The stand-in follows the build the model follows by default; the scenario pins the report's rc25.
BUILD = "engine_version=main-00746ef"
OUTCOME = ("engine_fatal", "fatal_message", "fatal_request_id", "requests_total", "requests_completed",
           "requests_failed", "requests_rejected", "sim_seconds", "iterations", "peak_utilization",
           "prefix_hit_rate", "queue_wait_p50_s", "queue_wait_p99_s", "pool_capacity_blocks")


def _kvscope(*args: str, standin: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVSCOPE_REMEDIATION_CHANNEL")}
    if standin:
        env["PYTHONPATH"] = str(STANDIN)
    env["KVSCOPE_DECISIONS_ONLY"] = "1"
    return subprocess.run([sys.executable, "-m", "kvscope", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _replay(tmp_path: Path, name: str, *extra: str) -> tuple[dict, list[dict]]:
    events = tmp_path / f"{name}.jsonl"
    done = _kvscope("replay", "--scenario", SCENARIO, "--set", BUILD, "--json", "--events", str(events), *extra)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return json.loads(done.stdout), rows[1:-1]


def _analysis(tmp_path: Path, name: str) -> dict:
    done = _kvscope("analyze", "--json", str(tmp_path / f"{name}.jsonl"))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["verdict"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, list[dict]]]:
    tmp = tmp_path_factory.mktemp("installed")
    out = {
        "model": _replay(tmp, "model"),
        "both": _replay(tmp, "both", "--scheduler", "installed", "--manager", "installed"),
        "scheduler": _replay(tmp, "scheduler", "--scheduler", "installed"),
    }
    out["verdicts"] = tuple(_analysis(tmp, name) for name in ("model", "both", "scheduler"))  # type: ignore[assignment]
    return out


@pytest.mark.slow
def test_replays_through_the_installed_classes_when_both_are_installed(runs):
    summary, _ = runs["both"]
    installed = summary["installed"]
    assert installed["scheduler"] == "tensorrt_llm._torch.pyexecutor.scheduler.scheduler_v2.KVCacheV2Scheduler"
    assert installed["manager"] == "tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2.KVCacheManagerV2"
    assert installed["tensorrt_llm"] == "1.3.0+kvscope-standin"
    assert installed["seam_table"] == "main-00746ef"
    assert installed["manager_mode"] == "decisions-only"
    assert summary["iterations_fast_forwarded"] == 0  # the model's shortcut resizes model caches only


@pytest.mark.slow
def test_same_outcome_as_the_model_when_both_are_installed(runs):
    model, _ = runs["model"]
    both, _ = runs["both"]
    assert model["engine_fatal"] is True  # the scenario ends in the draft pool's raise: something to agree on
    assert {k: both[k] for k in OUTCOME} == {k: model[k] for k in OUTCOME}


@pytest.mark.slow
def test_same_events_as_the_model_when_both_are_installed(runs):
    """The binding hooked the installed classes through its seams: every event the model's replay
    records is recorded, in the same order, for the same request, pool and iteration. The pool-state
    columns are read as TensorRT-LLM's are (once per iteration, -1 between), not from model counters."""
    def facts(rows):
        return [(r["kind"], r["request_id"], r["pool"], r["iteration"], r["num_tokens"]) for r in rows]

    _, model_rows = runs["model"]
    _, both_rows = runs["both"]
    assert len(model_rows) > 100
    assert facts(both_rows) == facts(model_rows)
    snapshots = [r for r in both_rows if r["kind"] == "pool_snapshot"]
    assert snapshots and all(r["capacity_blocks"] > 0 for r in snapshots)


@pytest.mark.slow
def test_scheduler_alone_gives_the_model_event_file_row_for_row(runs):
    def strip(rows):
        return [{k: v for k, v in r.items() if k != "pid"} for r in rows]

    model, model_rows = runs["model"]
    sched, sched_rows = runs["scheduler"]
    assert sched["installed"]["manager"] is None
    assert {k: sched[k] for k in OUTCOME} == {k: model[k] for k in OUTCOME}
    assert strip(sched_rows) == strip(model_rows)


@pytest.mark.slow
def test_analyzer_reads_the_installed_replay_as_the_model_replay(runs):
    model, both, sched = runs["verdicts"]
    for verdict in (both, sched):
        assert (verdict["status"], verdict["request_id"], verdict["pool"], verdict["iteration"]) == (
            model["status"], model["request_id"], model["pool"], model["iteration"])


@pytest.mark.slow
def test_remediation_runs_on_the_installed_classes_with_the_model_outcome(tmp_path):
    def replay(*extra):
        done = _kvscope("replay", "--scenario", SCENARIO, "--set", BUILD, "--json", "--remediation", "on", *extra)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    model = replay()
    both = replay("--scheduler", "installed", "--manager", "installed")
    assert model["engine_fatal"] is False  # the policy saves this run
    assert {k: both[k] for k in OUTCOME} == {k: model[k] for k in OUTCOME}
    keys = ("reservations_made", "reservations_released", "rejected", "contained")
    assert {k: both["remediation"][k] for k in keys} == {k: model["remediation"][k] for k in keys}


def test_refused_in_one_line_when_tensorrt_llm_is_not_importable():
    done = _kvscope("replay", "--scenario", SCENARIO, "--scheduler", "installed", "--json", standin=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "tensorrt_llm is not importable" in done.stderr


def test_refused_naming_the_seams_a_build_lacks(tmp_path):
    """A copy of the stand-in whose scheduler's ``_try_allocate_context`` is no method and whose manager's
    ``resize_context`` gained a parameter: both named, nothing replayed."""
    root = tmp_path / "drifted"
    subprocess.run(["cp", "-r", str(STANDIN), str(root)], check=True)
    sched = root / "tensorrt_llm/_torch/pyexecutor/scheduler/scheduler_v2.py"
    sched.write_text(sched.read_text() + "\n\nclass _Drifted(KVCacheV2Scheduler):\n"
                     "    _try_allocate_context = property(lambda self: 0)\n\n\nKVCacheV2Scheduler = _Drifted\n")
    mgr = root / "tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py"
    mgr.write_text(mgr.read_text() + "\n    def resize_context(self, req, num_tokens, history_length=None):\n"
                   "        return super().resize_context(req, num_tokens)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(root), KVSCOPE_DECISIONS_ONLY="1")
    done = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", SCENARIO, "--json",
                           "--scheduler", "installed", "--manager", "installed"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line
    assert "lacks seams kvscope records" in line
    assert "KVCacheV2Scheduler._try_allocate_context" in line
    assert "KVCacheManagerV2.resize_context (parameters changed" in line


def test_manager_installed_alone_is_refused_in_one_line():
    done = _kvscope("replay", "--scenario", SCENARIO, "--manager", "installed", "--json")
    assert done.returncode == 2
    assert "--manager installed needs --scheduler installed" in done.stderr


def test_notebook_replays_take_the_same_picks(tmp_path):
    code = (
        "import json, sys\n"
        "from kvscope.attach.runs import record_replay\n"
        "out = []\n"
        "for label, picks in (('model', {}), ('installed', {'scheduler': 'installed', 'manager': 'installed'})):\n"
        f"    s = record_replay({SCENARIO!r}, [{BUILD!r}], label=label, out_dir=sys.argv[1], **picks).summary\n"
        "    out.append([s.engine_fatal, s.fatal_request_id, s.requests_completed, s.sim_seconds])\n"
        "from kvscope.attach.launcher import ReplayLauncher\n"
        "launcher = ReplayLauncher(pace=0, scheduler='installed', manager='installed')\n"
        f"run, _ = launcher.start({SCENARIO!r}, {{'engine_version': 'main-00746ef'}})\n"
        "s = run.wait()\n"
        "out.append([s.engine_fatal, s.fatal_request_id, s.requests_completed, s.sim_seconds])\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(STANDIN), KVSCOPE_DECISIONS_ONLY="1")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    model, installed, picked = json.loads(done.stdout.strip().splitlines()[-1])
    assert model[0] is True  # the draft pool's raise
    assert installed == model
    assert picked == model  # the dashboard picker's launcher, set to the installed classes
