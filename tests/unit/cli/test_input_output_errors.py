"""Input, configuration and output errors are one line and a non-zero exit, checked before work
starts where they can be; never an engine crash, never a traceback, never a silent success."""

from __future__ import annotations

import io
import json
import lzma
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from kvscope.cli import main

TRACE_ROW = {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}


def one_line_error(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_bad_trace_row_after_the_first_line_is_an_input_error_not_engine_fatal(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    rows = [json.dumps({**TRACE_ROW, "timestamp": i}) for i in range(5)] + ['{"timestamp": "x"}']
    trace.write_text("\n".join(rows) + "\n")
    line = one_line_error(capsys, "replay", "--trace", str(trace), "--json")
    assert str(trace) in line and "line 6" in line and "'timestamp'" in line


def test_tar_xz_that_is_not_xz_is_an_input_error_when_replayed(tmp_path, capsys):
    trace = tmp_path / "t.tar.xz"
    trace.write_bytes(b"this is not an xz archive at all\n" * 10)
    assert str(trace) in one_line_error(capsys, "replay", "--trace", str(trace), "--json")


def test_truncated_tar_xz_is_an_input_error_when_replayed(tmp_path, capsys):
    member = tmp_path / "trace_0000.json"
    member.write_text(json.dumps({"id": "a", "requests": [{"t": 0, "in": 100, "out": 5}]}) * 2000)
    whole = tmp_path / "whole.tar.xz"
    with tarfile.open(whole, "w:xz") as tar:
        tar.add(member, arcname="traces/trace_0000.json")
    cut = tmp_path / "cut.tar.xz"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert lzma.LZMADecompressor().decompress(data[:64])  # really xz, cut in half
    assert str(cut) in one_line_error(capsys, "replay", "--trace", str(cut), "--json")


def _archive(path: Path, members: dict[str, object]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, doc in members.items():
            data = (doc if isinstance(doc, str) else json.dumps(doc)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


SESSION = {"id": "s", "block_size": 64, "hash_id_scope": "local", "tool_tokens": 0, "system_tokens": 0}
NO_REQUEST_TRACES = {
    "empty.jsonl": ("", "trace holds no requests (the file is empty)"),
    "blank.jsonl": ("\n  \n\n", "trace holds no requests (its 3 line(s) are blank)"),
    "none.tar.xz": ({}, "holds no *.json session member"),
    "readme-only.tar.xz": ({"traces/README.txt": "no sessions here"}, "holds no *.json session member"),
    "no-turn.tar.xz": ({"traces/trace_0000.json": {**SESSION, "requests": []}}, "holds no main-agent LLM request"),
    "empty-subagent.tar.xz": ({"traces/trace_0000.json": {**SESSION, "requests": [
        {"type": "subagent", "t": 0.0, "requests": []}]}}, "holds no main-agent LLM request"),
}


@pytest.mark.parametrize("name", sorted(NO_REQUEST_TRACES))
def test_a_trace_with_no_request_is_an_input_error_never_a_healthy_replay(tmp_path, capsys, name):
    content, problem = NO_REQUEST_TRACES[name]
    trace = tmp_path / name
    if isinstance(content, str):
        trace.write_text(content)
    else:
        _archive(trace, content)
    line = one_line_error(capsys, "replay", "--trace", str(trace), "--json")
    assert line.startswith(f"kvscope replay: error: {trace}: ") and line.endswith(problem)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_non_finite_knob_is_refused_with_its_name_when_set(value, capsys):
    line = one_line_error(capsys, "replay", "--scenario", "near-miss", "--set", f"prefill_s_per_token={value}",
                          "--json")
    assert "prefill_s_per_token" in line and "finite" in line


def test_events_path_that_cannot_be_written_is_refused_before_the_replay(tmp_path, capsys):
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    (tmp_path / "d.parquet").mkdir()
    for bad in (a_file / "ev.parquet", tmp_path / "d.parquet", "/proc/kvscope-nope/ev.jsonl", tmp_path / "ev.csv"):
        line = one_line_error(capsys, "replay", "--scenario", "oversize", "--events", str(bad), "--json")
        assert str(Path(bad).name) in line or "must end in" in line


def test_missing_or_directory_trace_is_refused_when_replayed(tmp_path, capsys):
    assert "no such trace file" in one_line_error(capsys, "replay", "--trace", str(tmp_path / "x.jsonl"))
    (tmp_path / "d.jsonl").mkdir()
    assert "is a directory" in one_line_error(capsys, "replay", "--trace", str(tmp_path / "d.jsonl"))


@pytest.mark.parametrize("argv", [["replay", "--list-knobs"], ["replay", "--scenario", "oversize", "--json"]])
def test_closed_pipe_gives_no_traceback_when_the_reader_goes_away(argv):
    """``kvscope ... | head -1``: the reader closes its end before kvscope writes."""
    proc = subprocess.Popen([sys.executable, "-m", "kvscope", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert err == "" and proc.returncode == 141


LAUNCHER = [sys.executable, "-m", "kvscope.app.launcher"]


def launch(args, *, env=None, timeout=120):
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    return subprocess.run([*LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                          env={**base, **(env or {})})


def test_unwritable_output_dir_is_refused_before_the_command_runs(tmp_path):
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    marker = tmp_path / "ran"
    for bad in (a_file / "events", "/proc/kvscope-nope"):
        done = launch(["--output-dir", str(bad), sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "output-dir" in done.stderr
        assert not marker.exists()


@pytest.mark.parametrize("sinks", ["jsnol", "jsonl,parqet", ",", "json"])
def test_misspelt_sink_name_is_an_error_before_the_command_runs(tmp_path, sinks):
    marker = tmp_path / "ran"
    done = launch(["--output-dir", str(tmp_path), "--sinks", sinks, sys.executable, "-c",
                   f"open({str(marker)!r}, 'w')"])
    assert done.returncode == 2 and "unknown sink" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize("variable,value", [("KVSCOPE_SINKS", "zmqq"), ("KVSCOPE_ENGINE", "vllm"),
                                            ("KVSCOPE_RANK", "minus-one")])
def test_bad_environment_variable_is_an_error_before_the_command_runs(tmp_path, variable, value):
    done = launch(["--output-dir", str(tmp_path), sys.executable, "-c", "pass"], env={variable: value})
    assert done.returncode == 2 and variable in done.stderr and "Traceback" not in done.stderr


ENGINE_RUN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import kvscope.engine_model.executor  # the instrumentation starts here (sinks open)
    Path(sys.argv[1]).write_text("up")
    deadline = time.monotonic() + 60
    while not Path(sys.argv[2]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.path.insert(0, sys.argv[3])
    from conftest import ListWorkload, make_engine
    from kvscope.workloads.workload import WorkloadRequest
    engine = make_engine()
    engine.run(ListWorkload([WorkloadRequest(i, 0.001 * i, 8, 2, (i,)) for i in range(3)]))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_second_instrumented_process_keeps_its_file_when_its_live_port_is_taken(tmp_path):
    """Two ``kvscope-instrument --sinks zmq,jsonl`` on one host: the second's port clash is reported
    and its file recording still works."""
    script = tmp_path / "engine_run.py"
    script.write_text(ENGINE_RUN)
    conftest_dir = str(Path(__file__).resolve().parents[1] / "engines")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    go = tmp_path / "go"

    def start(name):
        out = tmp_path / name
        base = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
        proc = subprocess.Popen([*LAUNCHER, "--output-dir", str(out), "--sinks", "zmq,jsonl",
                                 "--zmq-endpoint", endpoint, "--engine", "model", sys.executable,
                                 str(script), str(tmp_path / f"{name}.up"), str(go), conftest_dir],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base)
        return proc, out

    first, out1 = start("first")
    deadline = time.monotonic() + 60
    while not (tmp_path / "first.up").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second, out2 = start("second")
    while not (tmp_path / "second.up").exists():
        assert second.poll() is None and time.monotonic() < deadline, second.communicate()
        time.sleep(0.05)
    go.write_text("go")
    _, err1 = first.communicate(timeout=120)
    _, err2 = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, (err1, err2)
    assert "sink zmq unavailable" not in err1
    assert "sink zmq unavailable" in err2 and "recording continues in: jsonl" in err2
    from kvscope.recording import read_frame

    for out in (out1, out2):
        (path,) = out.glob("events-rank0-pid*.jsonl")
        frame = read_frame(path)
        facts = frame.attrs["kvscope"]["files"][0]
        assert (frame["kind"] == "request_finished").sum() == 3 and facts["status"] == "complete"
    header = read_frame(next(out2.glob("*.jsonl"))).attrs["kvscope"]["files"][0]["header"]
    assert "zmq" in header["meta"]["sinks_failed"]
