"""``kvscope-instrument`` for real: two engine-model processes, two rank-tagged files, one timeline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvscope.app.autoload import rank_from_env
from kvscope.app.launcher import BOOTSTRAP_DIR, build_env
from kvscope.events import EventKind
from kvscope.recording import read_frame

CHILD = textwrap.dedent("""
    from kvscope.engine_model.config import EngineConfig
    from kvscope.engine_model.cost_model import CostModel
    from kvscope.engine_model.executor import PyExecutorModel, SimClock
    from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
    from kvscope.engine_model.resource_manager import create_resource_manager
    from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel
    from kvscope.workloads.workload import WorkloadRequest

    class Arrivals:
        def __init__(self, reqs):
            self.reqs = list(reqs)
        def pop_arrivals(self, now_s):
            out = [r for r in self.reqs if r.arrival_s <= now_s]
            self.reqs = [r for r in self.reqs if r.arrival_s > now_s]
            return out
        def next_arrival_s(self):
            return min((r.arrival_s for r in self.reqs), default=None)
        def on_finished(self, request_id, now_s, *, failed=False):
            pass
        def is_exhausted(self):
            return not self.reqs

    common = dict(tokens_per_block=4, max_seq_len=64, max_batch_size=4, max_num_tokens=64, max_draft_len=1,
                  pp_size=globals().get("PP_SIZE", 1))
    target = KVCacheManagerV2Model(num_blocks=32, **common)
    draft = KVCacheManagerV2Model(num_blocks=32, is_draft=True, **common)
    config = EngineConfig(max_batch_size=4, max_num_tokens=64, max_seq_len=64, tokens_per_block=4, max_draft_len=1)
    executor = PyExecutorModel(config, create_resource_manager(target, draft),
                               KVCacheV2SchedulerModel(4, 64, target, draft_kv_cache_manager=draft),
                               CostModel.from_config(config), SimClock())
    executor.run(Arrivals([WorkloadRequest(i, 0.001 * i, 10, 3, (11, 12)) for i in range(4)]))
    assert executor.stats.requests_completed == 4
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
    procs = [subprocess.Popen([sys.executable, child], env={**os.environ, "RANK": str(r)}) for r in range(2)]
    sys.exit(max(p.wait() for p in procs))
""")


def test_two_processes_write_two_rank_tagged_files_that_merge_when_started_through_kvscope_instrument(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "parent.py").write_text(PARENT)
    out = tmp_path / "events"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    done = subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out),
                           "--engine", "model", sys.executable, str(tmp_path / "parent.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    files = sorted(out.glob("events-rank*-pid*.jsonl"))
    assert [f.name.split("-")[1] for f in files] == ["rank0", "rank1"]
    frame = read_frame(files)
    assert sorted(frame["rank"].unique().tolist()) == [0, 1]
    pids = frame.groupby("rank")["pid"].unique()
    assert all(len(p) == 1 for p in pids) and pids[0][0] != pids[1][0]
    assert [int(f.name.split("pid")[1].split(".")[0]) for f in files] == [int(pids[0][0]), int(pids[1][0])]
    assert frame["epoch_ns"].is_monotonic_increasing
    for rank in (0, 1):
        mine = frame[frame["rank"] == rank]
        assert (mine["kind"] == EventKind.REQUEST_FINISHED.value).sum() == 4
        assert (mine["kind"] == EventKind.POOL_CONFIGURED.value).sum() == 2
    headers = [f["header"]["meta"] for f in frame.attrs["kvscope"]["files"]]
    assert [h["rank"] for h in headers] == [0, 1]
    assert all(h["engine"] == "engine_model" and set(h["pools"]) == {"target", "draft"} for h in headers)


def test_parent_without_an_engine_writes_no_file_when_it_never_imports_one(tmp_path):
    out = tmp_path / "events"
    done = subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out),
                           sys.executable, "-c", "import kvscope.events"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not out.exists() or list(out.iterdir()) == []


def test_environment_puts_the_bootstrap_first_when_built():
    env = build_env({"PYTHONPATH": "/somewhere"}, output_dir="/tmp/x", sinks="jsonl,zmq", engine="model")
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(BOOTSTRAP_DIR) and parts[-1] == "/somewhere"
    assert (Path(parts[0]) / "sitecustomize.py").is_file()
    assert (env["KVSCOPE_OUTPUT_DIR"], env["KVSCOPE_SINKS"], env["KVSCOPE_ENGINE"]) == ("/tmp/x", "jsonl,zmq", "model")


def test_rank_comes_from_kvscope_then_mpi_then_torch_variables_when_set():
    assert rank_from_env({"KVSCOPE_RANK": "5", "OMPI_COMM_WORLD_RANK": "2", "RANK": "1"}) == 5
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "2", "RANK": "1"}) == 2
    assert rank_from_env({"RANK": "1"}) == 1
    assert rank_from_env({}) == 0


def test_missing_command_is_an_error_when_none_given():
    done = subprocess.run([sys.executable, "-m", "kvscope.app.launcher"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "no command given" in done.stderr


def test_sinks_follow_kvscope_sinks_when_the_process_starts(tmp_path):
    from kvscope.app.autoload import _make_sinks
    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.recording import JsonlSink, ParquetSink

    closers: list = []
    endpoint = f"ipc://{tmp_path}/live.sock"
    sinks = _make_sinks({"KVSCOPE_SINKS": "jsonl,parquet,zmq", "KVSCOPE_ZMQ_ENDPOINT": endpoint},
                        tmp_path, 2, 99, {"engine": "engine_model"}, closers)
    try:
        assert [type(s) for s in sinks] == [JsonlSink, ParquetSink, ZmqPublisherSink]
        assert sinks[0].path == tmp_path / "events-rank2-pid99.jsonl"
        assert sinks[1].path == tmp_path / "events-rank2-pid99.parquet"
        assert sinks[2].endpoint == endpoint
        assert closers == []
    finally:
        for s in sinks:
            s.shutdown()


FORKER = textwrap.dedent("""
    import os, sys
    from kvscope.app.autoload import boot, current_session
    boot()
    sys.path.insert(0, sys.argv[1])
    from conftest import ListWorkload, make_engine  # imports the engine model: the session starts
    from kvscope.workloads.workload import WorkloadRequest

    def work():
        engine = make_engine()
        engine.run(ListWorkload([WorkloadRequest(i, 0.001 * i, 10, 2, (1, 2)) for i in range(3)]))

    work()
    pid = os.fork()
    if pid == 0:
        work()
        current_session().close()
        os._exit(0)
    os.waitpid(pid, 0)
""")


def test_forked_child_writes_its_own_file_when_the_parent_was_instrumented(tmp_path):
    (tmp_path / "forker.py").write_text(FORKER)
    out = tmp_path / "events"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")},
           "KVSCOPE_OUTPUT_DIR": str(out), "KVSCOPE_ENGINE": "model"}
    done = subprocess.run([sys.executable, str(tmp_path / "forker.py"), str(Path(__file__).parent)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    files = sorted(out.glob("events-rank0-pid*.jsonl"))
    assert len(files) == 2
    frames = [read_frame(f) for f in files]
    assert [f["pid"].nunique() for f in frames] == [1, 1]
    assert frames[0]["pid"].iloc[0] != frames[1]["pid"].iloc[0]
    assert [int((f["kind"] == EventKind.REQUEST_FINISHED.value).sum()) for f in frames] == [3, 3]


@pytest.mark.slow
def test_kvscope_remediation_in_the_environment_attaches_remediation_at_start_in_every_rank(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "parent.py").write_text(PARENT)
    out = tmp_path / "events"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["KVSCOPE_REMEDIATION"] = "on:draft-reserve"
    done = subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out),
                           "--engine", "model", sys.executable, str(tmp_path / "parent.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    frame = read_frame(sorted(out.glob("events-rank*-pid*.jsonl")))
    for rank in (0, 1):
        mine = frame[frame["rank"] == rank]
        changes = mine[mine["kind"] == EventKind.REMEDIATION_MODE_CHANGED.value]
        assert list(changes["reason"].str.split().str[0]) == ["mode=on"]
        assert (mine["kind"] == EventKind.RESERVATION_MADE.value).sum() == 4
        assert (mine["kind"] == EventKind.RESERVATION_RELEASED.value).sum() == 4
        assert (mine["kind"] == EventKind.REQUEST_FINISHED.value).sum() == 4


def test_kvscope_sizing_is_checked_before_the_command_runs_in_one_line():
    from kvscope.app.launcher import check_env

    problems = check_env({"KVSCOPE_SINKS": "zmq", "KVSCOPE_SIZING": "auto"})
    assert len(problems) == 1 and problems[0].startswith("KVSCOPE_SIZING: expected a draft byte share")
    assert "auto needs a recorded run" in problems[0]
    assert check_env({"KVSCOPE_SINKS": "zmq", "KVSCOPE_SIZING": "4x"}) == []


def test_process_session_applies_kvscope_sizing_and_keeps_the_model_error_path_under_pp(tmp_path):
    from kvscope.app.autoload import ProcessSession
    from kvscope.engines import gate

    env = {"KVSCOPE_OUTPUT_DIR": str(tmp_path), "KVSCOPE_SINKS": "jsonl", "KVSCOPE_SIZING": "4x",
           "KVSCOPE_REMEDIATION": "on", "KVSCOPE_PP_SIZE": "2"}
    session = ProcessSession("model", env)
    try:
        assert session.sizing is not None and session.binding.budget_split is session.sizing
        assert session.sizing.label == "draft_token_ratio_4x"
        # The engine model's pipeline ranks share one state: its per-request error path stays usable.
        assert session.remediation is not None and gate.state_of(session.binding).error_path_off == ""
    finally:
        session.close()
    from kvscope.app.remedy import PP_ERROR_PATH_OFF, attach_from_env
    from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
    from kvscope.engines.binding import Binding
    from kvscope.engines.model.state import ModelPoolReader
    from kvscope.recording import Recorder

    binding = Binding(Recorder(), ModelPoolReader())
    attach_from_env(binding, {"KVSCOPE_REMEDIATION": "on", "KVSCOPE_PP_SIZE": "2"}, real_engine=True)
    # The pipeline size is the engine's: read from its managers' mapping once they are found.
    assert gate.state_of(binding).error_path_off == ""
    common = dict(num_blocks=8, tokens_per_block=4, max_seq_len=64, max_batch_size=4, pp_size=2)
    for manager in (KVCacheManagerV2Model(**common), KVCacheManagerV2Model(is_draft=True, **common)):
        binding.discover(manager)
    gate.pool_configs(binding, gate.state_of(binding))  # the first pass reads them
    assert gate.state_of(binding).error_path_off == PP_ERROR_PATH_OFF
    gate.found_executor(binding, object())
    assert gate.state_of(binding).error_path is None and binding.executor is not None


def _subscribe_late(session, endpoint: str, *, pp_size: int = 1):
    """The engine runs (CHILD, its managers on ``pp_size`` pipeline stages) under ``session`` and
    publishes; then a subscriber joins, and hears the engine's next batch. Returns (subscriber, its
    first batches)."""
    import time

    from kvscope.engines.live import LiveSubscriber
    from kvscope.events import PoolRole

    exec(compile(CHILD, "child", "exec"), {"PP_SIZE": pp_size})
    session.pump.flush()
    sub = LiveSubscriber(endpoint)
    got: list = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        session.recorder.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.DRAFT, 0, 0, num_requests=0,
                                capacity_blocks=32, free_blocks=32, evictable_blocks=0, reserved_blocks=0)
        got = sub.poll_batches(timeout_ms=100)
    assert got and sub.missed_at_start > 0  # it joined after the engine's first events
    return sub, got


def test_a_subscriber_that_joins_a_running_engine_reads_the_remediation_in_force_from_its_stream(tmp_path):
    """kvscope-instrument keeps the state in force in the live stream's header: the mode change's
    event was published before anyone subscribed, and a late subscriber still knows the mode."""
    import socket

    from kvscope.app.autoload import ProcessSession

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    env = {"KVSCOPE_OUTPUT_DIR": str(tmp_path), "KVSCOPE_SINKS": "zmq", "KVSCOPE_ZMQ_ENDPOINT": endpoint,
           "KVSCOPE_REMEDIATION": "on:draft-reserve", "KVSCOPE_PP_SIZE": "2"}
    session = ProcessSession("model", env)
    sub = None
    try:
        # After the engine's events, the mode change's among them; the engine has the declared stages.
        sub, _got = _subscribe_late(session, endpoint, pp_size=2)
        assert sub.meta["remediation"].split()[:2] == ["mode=on", "policy=draft-reserve"]
        assert "enforcing=1" in sub.meta["remediation"].split()
        assert (sub.meta["engine"], sub.meta["pp_size"]) == ("engine_model", 2)  # what its export is labelled with
    finally:
        if sub is not None:
            sub.close()
        session.close()


def test_a_subscriber_that_joins_a_running_engine_finds_the_events_it_missed_in_the_file_the_stream_names(tmp_path):
    """kvscope-instrument with a file sink beside the stream names that file (absolute) in the
    stream's header: a late subscriber reads there exactly the events published before it joined."""
    import os
    import socket

    from kvscope.app.autoload import ProcessSession
    from kvscope.events.schema import RAW_FIELDS
    from kvscope.recording.catch_up import read_missed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a relative output dir: the name in the stream must not depend on the reader's cwd
    try:
        session = ProcessSession("model", {"KVSCOPE_OUTPUT_DIR": "ev", "KVSCOPE_SINKS": "zmq,jsonl",
                                           "KVSCOPE_ZMQ_ENDPOINT": endpoint})
    finally:
        os.chdir(cwd)
    sub = None
    try:
        sub, got = _subscribe_late(session, endpoint)
        named = sub.meta["events_file"]
        assert named == str(tmp_path / "ev" / f"events-rank0-pid{os.getpid()}.jsonl")
        h = got[0].header
        missed = read_missed(named, h.first_event, h.anchor, run_id=h.run_id)  # the file trails the stream
        assert len(missed) == sub.missed_at_start
        kind = RAW_FIELDS.index("kind")
        rows = [r for c in missed.raw_chunks(1000) for r in c]
        assert {r[kind].value for r in rows} >= {"pool_configured", "request_arrived"}  # what an analyzer needs
    finally:
        if sub is not None:
            sub.close()
        session.close()


def test_kvscope_remediation_names_its_mode_and_policy_in_any_case_and_refuses_unknown_ones_in_one_line():
    from kvscope.app.remediation_setting import parse_remediation_setting
    from kvscope.app.remedy import attach_from_env
    from kvscope.engines.binding import Binding
    from kvscope.engines.model.state import ModelPoolReader
    from kvscope.recording import Recorder

    ctl = attach_from_env(Binding(Recorder(), ModelPoolReader()), {"KVSCOPE_REMEDIATION": " ON:Worst-Case ",
                                                                  "KVSCOPE_MAX_SEQ_LEN": "4096"},
                          real_engine=False)
    assert ctl is not None and ctl.policy_name == "worst-case"
    assert parse_remediation_setting("Auto") == ("auto", "draft-headroom")
    assert parse_remediation_setting("Worst-Case") == ("on", "worst-case")
    import pytest

    with pytest.raises(ValueError, match=r"expected MODE\[:POLICY\] or POLICY"):
        attach_from_env(Binding(Recorder(), ModelPoolReader()), {"KVSCOPE_REMEDIATION": "enable"}, real_engine=False)


REMEDIATION_VALUES = ["on", " ON:Worst-Case ", "Auto", "shadow:joint-admission", "off:draft-reserve", "worst-case",
                      "Draft-Reserve", "on:draft-reserv", "on:shadow", "enable", "worst-case:draft-reserve",
                      ":worst-case", "on:", "on:draft-reserve:x", "draft reserve"]


def test_the_launcher_refuses_exactly_the_kvscope_remediation_values_a_worker_cannot_attach():
    """The launcher refuses, before the command runs, exactly what a worker's attach refuses."""
    from kvscope.app.launcher import remediation_problem
    from kvscope.app.remediation_setting import parse_remediation_setting

    refused = []
    for value in REMEDIATION_VALUES:
        problem = remediation_problem({"KVSCOPE_REMEDIATION": value, "KVSCOPE_MAX_SEQ_LEN": "4096"})
        try:
            parse_remediation_setting(value)
        except ValueError as e:
            assert problem == f"KVSCOPE_REMEDIATION: {e}"
            refused.append(value)
        else:
            assert problem is None, value
    assert refused == REMEDIATION_VALUES[7:]


def test_kvscope_remediation_worst_case_without_max_seq_len_is_refused_before_the_command_runs():
    from kvscope.app.launcher import check_env

    assert check_env({"KVSCOPE_SINKS": "zmq", "KVSCOPE_REMEDIATION": "on:worst-case"}) == [
        "KVSCOPE_REMEDIATION: the worst-case policy needs the engine's max_seq_len: set KVSCOPE_MAX_SEQ_LEN (tokens)"]
    assert check_env({"KVSCOPE_SINKS": "zmq", "KVSCOPE_REMEDIATION": "Worst-Case", "KVSCOPE_MAX_SEQ_LEN": "8192"}) == []
    assert check_env({"KVSCOPE_SINKS": "zmq", "KVSCOPE_REMEDIATION": "on", "KVSCOPE_PP_SIZE": "two"}) == [
        "KVSCOPE_PP_SIZE: expected a number of pipeline ranks, got 'two'"]


def test_misspelt_kvscope_remediation_policy_exits_2_in_one_line_and_the_command_never_runs(tmp_path):
    marker = tmp_path / "ran"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["KVSCOPE_REMEDIATION"] = "on:draft-reserv"
    done = subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(tmp_path / "ev"),
                           sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not marker.exists()
    assert done.stderr.splitlines() == [
        "kvscope-instrument: error: KVSCOPE_REMEDIATION: expected MODE[:POLICY] or POLICY, any case (modes: off, "
        "shadow, on, auto; policies: draft-headroom, draft-reserve, worst-case, joint-admission), got 'on:draft-reserv'"]


def test_a_worker_given_a_bad_kvscope_remediation_says_so_in_one_line_and_runs_without_it(tmp_path, capfd):
    """A process given the variable past the launcher (an MPI or Ray environment) cannot refuse to
    start: one stderr line, no traceback, the engine as stock."""
    from kvscope.app.autoload import ProcessSession

    session = ProcessSession("model", {"KVSCOPE_OUTPUT_DIR": str(tmp_path), "KVSCOPE_SINKS": "jsonl",
                                       "KVSCOPE_REMEDIATION": "on:draft-reserv", "KVSCOPE_SIZING": "lots"})
    try:
        assert session.remediation is None and session.sizing is None
    finally:
        session.close()
    err = capfd.readouterr().err
    prefix = f"kvscope-instrument: rank 0 pid {os.getpid()}: "
    sizing, remediation = err.splitlines()  # one line each, no traceback
    assert sizing.startswith(prefix + "KVSCOPE_SIZING not applied: ") and "got 'lots'" in sizing
    assert sizing.endswith("; the engine splits its KV budget as stock")
    assert remediation == (
        prefix + "KVSCOPE_REMEDIATION not applied: expected MODE[:POLICY] or POLICY, any case (modes: off, shadow, "
                 "on, auto; policies: draft-headroom, draft-reserve, worst-case, joint-admission), got 'on:draft-reserv'; "
                 "the engine runs without remediation")


def test_a_bad_launcher_flag_exits_2_in_one_line_and_the_command_never_runs(tmp_path):
    """The launcher's own flags get the CLI's one-line errors (kvscope.arguments), not argparse's
    usage block first."""
    marker = tmp_path / "ran"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    done = subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--engine", "vllm",
                           sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not marker.exists()
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvscope-instrument: error: argument --engine: invalid choice: 'vllm'"), lines
    assert lines[0].endswith("(see kvscope-instrument --help)"), lines
