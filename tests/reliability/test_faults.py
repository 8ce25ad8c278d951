"""Fault injection: the engine model behaves exactly as without kvscope, kvscope reports what it
dropped, and what it wrote before the fault stays readable.

Faults: resize/resume failures forced at random calls (raise, or refuse as a shortage); the event
sink's disk full (RLIMIT_FSIZE) mid-run; a worker process killed under kvscope-instrument. The disk
turned read-only, the OTel collector killed and the live subscriber stalled or killed mid-run are
in test_faults_disk.py, test_faults_otel.py and test_faults_live.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from engine_checks import ListWorkload, engine_configs, workloads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope import replay
from kvscope.app.session import EventFileSession
from kvscope.engine_model import kv_cache
from kvscope.engine_model.fast_forward import fast_forward_decode
from kvscope.engines.instrumentor import uninstrument
from kvscope.recording import MemorySink, read_file


class InjectedFault(RuntimeError):
    """Raised by a forced resize/resume failure."""


class Injector:
    """Make the ``at``-th call (0-based, counted over resize and resume) fail as ``how``.

    Calls from the model's decode fast-forward are left alone: that shortcut has no counterpart in
    the real engine (whose resizes all happen inside hooked seams), checks its pages before it
    resizes and cannot fail; a raise injected there left no ENGINE_FAILED on record (a fault the
    real engine cannot have), which an example with ``mtp_acceptance_rate=0`` found.
    """

    def __init__(self, at: int, how: str) -> None:
        self.at, self.how, self.calls, self.fired = at, how, 0, False

    def wrap(self, original):
        def faulty(cache, *args, **kwargs):
            if sys._getframe(1).f_code is fast_forward_decode.__code__:
                return original(cache, *args, **kwargs)
            n = self.calls
            self.calls += 1
            if n == self.at:
                self.fired = True
                if self.how == "raise":
                    raise InjectedFault(f"injected fault at call {n}")
                return False
            return original(cache, *args, **kwargs)

        return faulty


def _replay(config, requests, monkeypatch, injector, *, recorded):
    sink = MemorySink()
    with monkeypatch.context() as m:
        for name in ("resize", "resume"):
            m.setattr(kv_cache._KVCacheModel, name, injector.wrap(getattr(kv_cache._KVCacheModel, name)))
        instrument = (lambda parts: EventFileSession(None, extra_sinks=[sink])(parts)) if recorded else None
        try:
            summary = replay.run("near-miss", config=config, workload=ListWorkload(list(requests), config.tokens_per_block),
                                 instrument=instrument)
        finally:
            uninstrument()
    d = summary.to_dict()
    d.pop("wall_seconds")
    return d, sink


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # monkeypatch.context() per example
@given(st.data())
def test_forced_resize_and_resume_failures_end_the_same_with_and_without_kvscope(monkeypatch, data):
    config = data.draw(engine_configs())
    requests = data.draw(workloads(config))
    at = data.draw(st.integers(0, 60))
    how = data.draw(st.sampled_from(["raise", "refuse"]))
    plain, _ = _replay(config, requests, monkeypatch, Injector(at, how), recorded=False)
    injector = Injector(at, how)
    recorded, sink = _replay(config, requests, monkeypatch, injector, recorded=True)
    assert recorded == plain
    if injector.fired and how == "raise":
        assert plain["engine_fatal"] and "injected fault" in plain["fatal_message"]
        kinds = {e.kind.value for e in sink.events}
        assert "engine_failed" in kinds  # the fault is on record, with everything before it


DISK_FULL_REPLAY = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a full disk: writes fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
    from kvscope.cli import main
    sys.exit(main(["replay", "--scenario", "near-miss", "--events", sys.argv[2], "--json"]))
""")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_full_disk_drops_events_counted_and_keeps_what_was_written_when_recording(tmp_path, suffix):
    plain = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "near-miss", "--json"],
                           capture_output=True, text=True, timeout=300)
    events = tmp_path / f"ev{suffix}"
    script = tmp_path / "full.py"
    script.write_text(DISK_FULL_REPLAY)
    full = subprocess.run([sys.executable, str(script), "60000", str(events)], capture_output=True, text=True,
                          timeout=300)
    assert "Traceback" not in full.stderr
    a, b = json.loads(plain.stdout), json.loads(full.stdout)
    for d in (a, b):
        d.pop("wall_seconds")
    b_events = b.pop("events", None)
    assert b == {k: v for k, v in a.items() if k != "events"}  # the engine did exactly the same
    assert full.returncode == 1 and "dropped" in full.stderr  # kvscope says what it lost
    assert b_events is not None and b_events["dropped"] > 0
    kept = events if events.exists() else events.with_name(events.name + ".partial")
    df = read_file(kept, on_error="keep")  # what was written before the fault stays readable
    facts = df.attrs["kvscope"]["files"][0]
    assert facts["readable"] and facts["complete"] is False
    if suffix == ".jsonl":
        assert len(df) > 0  # whole lines up to the cut; a Parquet batch is all or nothing (may be the first)


WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from conftest import ListWorkload, make_engine
    from kvscope.workloads.workload import WorkloadRequest
    engine = make_engine()
    engine.run(ListWorkload([WorkloadRequest(i, 0.001 * i, 8, 2, (i,)) for i in range(4)]))
    Path(sys.argv[1]).write_text("done")
    time.sleep(float(sys.argv[3]))
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys
    here = os.path.dirname(os.path.abspath(__file__))
    procs = [subprocess.Popen([sys.executable, os.path.join(here, "worker.py"), os.path.join(here, f"w{r}.done"),
                               sys.argv[1], sys.argv[2 + r]], env={**os.environ, "RANK": str(r)})
             for r in range(2)]
    with open(os.path.join(here, "pids"), "w") as fh:
        fh.write(" ".join(str(p.pid) for p in procs))
    ok = procs[0].wait() == 0
    procs[1].wait()  # killed by the test; waiting keeps the run (and the launcher) alive until then,
    sys.exit(0 if ok else 1)  # so a slow rank 1 cannot outlive a run that already ended
""")


def test_killed_worker_leaves_a_readable_cut_off_file_and_the_other_rank_completes(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "parent.py").write_text(PARENT)
    out = tmp_path / "events"
    conftest_dir = str(Path(__file__).resolve().parents[1] / "unit" / "engines")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    proc = subprocess.Popen([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out),
                             "--engine", "model", sys.executable, str(tmp_path / "parent.py"), conftest_dir,
                             "0", "120"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while not ((tmp_path / "w1.done").exists() and (tmp_path / "pids").exists()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    # Rank 1's pump writes every 50 ms: wait until its four finishes are on disk (a loaded machine
    # may take far longer than that), so the kill cuts the file after them.
    while sum(p.read_text(errors="replace").count("request_finished") for p in out.glob("events-rank1-pid*.jsonl")) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    victim = int((tmp_path / "pids").read_text().split()[1])
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    files = {int(p.name.split("-")[1][4:]): p for p in out.glob("events-rank*-pid*.jsonl")}
    assert sorted(files) == [0, 1]
    done = read_file(files[0]).attrs["kvscope"]["files"][0]
    assert done["status"] == "complete"
    cut = read_file(files[1], on_error="keep")
    facts = cut.attrs["kvscope"]["files"][0]
    assert facts["status"] == "cut off" and facts["complete"] is False
    assert (cut["kind"] == "request_finished").sum() == 4  # every event before the kill is readable
    # the killed rank's run is not called healthy: its end is missing
    res = subprocess.run([sys.executable, "-m", "kvscope", "analyze", "--json", str(files[0]), str(files[1])],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    v = json.loads(res.stdout)["verdict"]
    assert v["status"] == "incomplete" and f"{files[1]} (cut off)" in v["message"]
