"""Fuzzing every reader (hypothesis): event files, traces, CLI arguments, kvscope-instrument's
environment. Contract: no traceback (only the reader's documented error), no hang, and no silent
acceptance of garbage (every row kept is valid; every row not kept is counted)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvscope.app.launcher import check_env
from kvscope.cli import main
from kvscope.events import EVENT_KINDS, FIELDS, POOL_ROLES
from kvscope.recording import BatchPump, EventFileError, Recorder, read_file, sink_for_path
from kvscope.workloads.traces_mooncake import create_mooncake_workload
from kvscope.workloads.workload import TraceFormatError

KINDS = [k.value for k in EVENT_KINDS]
POOLS = [p.value for p in POOL_ROLES]
TMP = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                         st.text(max_size=12))
field_values = st.one_of(json_scalars, st.sampled_from(KINDS + POOLS), st.integers(-5, 10**6))


def good_row(i: int) -> dict:
    row = {f: i for f in FIELDS}
    row.update(kind=KINDS[i % len(KINDS)], pool=POOLS[i % len(POOLS)], reason="")
    return row


@st.composite
def event_lines(draw):
    """A JSON Lines body: valid rows, rows with one field mutated or missing, and raw garbage."""
    lines, expect_kept = [], 0
    for i in range(draw(st.integers(0, 12))):
        choice = draw(st.sampled_from(["good", "mutate", "drop", "garbage"]))
        row = good_row(i)
        if choice == "good":
            lines.append(json.dumps(row))
            expect_kept += 1
        elif choice == "mutate":
            field = draw(st.sampled_from(FIELDS))
            row[field] = draw(field_values)
            lines.append(json.dumps(row))
        elif choice == "drop":
            del row[draw(st.sampled_from(FIELDS))]
            lines.append(json.dumps(row))
        else:
            lines.append(draw(st.text(min_size=1, max_size=30).filter(lambda t: "\n" not in t and t.strip())))
    return lines, expect_kept


def _header_line(tmp_path) -> str:
    path = tmp_path / "h.jsonl"
    rec = Recorder(clock=lambda: 0)
    BatchPump(rec, [sink_for_path(path)], start=False).shutdown()
    return path.read_text().splitlines()[0]


def _valid_kept_rows(df) -> bool:
    if not len(df):
        return True
    ints = [f for f in FIELDS if f not in ("kind", "pool", "reason")]
    return (df["kind"].isin(KINDS).all() and df["pool"].isin(POOLS).all()
            and all(str(df[f].dtype).startswith("int") for f in ints))


@TMP
@given(event_lines())
def test_jsonl_event_reader_keeps_only_valid_rows_and_counts_the_rest_when_fuzzed(tmp_path, body):
    lines, at_least_kept = body
    path = tmp_path / "f.jsonl"
    path.write_text("\n".join([_header_line(tmp_path), *lines]) + "\n")
    df = read_file(path, on_error="keep")
    facts = df.attrs["kvscope"]["files"][0]
    assert _valid_kept_rows(df)
    assert len(df) >= at_least_kept
    assert len(df) + facts["rows_dropped"] == len([x for x in lines if x.strip()])
    assert facts["complete"] is not True  # no end record: never a clean, complete recording


@TMP
@given(st.binary(max_size=600), st.sampled_from([".parquet", ".jsonl", ".partial", ".bin"]))
def test_random_bytes_are_refused_with_the_file_name_when_read_as_events(tmp_path, data, suffix):
    path = tmp_path / f"r{suffix}"
    path.write_bytes(data)
    try:
        df = read_file(path)
    except EventFileError as e:
        assert str(path) in str(e)
        return
    # Accepted: only possible for a real header; then every kept row is valid.
    assert df.attrs["kvscope"]["files"][0]["header"] is not None and _valid_kept_rows(df)


@pytest.fixture(scope="module")
def real_files(tmp_path_factory):
    out = {}
    d = tmp_path_factory.mktemp("real")
    for ext in ("parquet", "jsonl"):
        rec = Recorder(clock=lambda: 5)
        for i in range(40):
            rec.record(EVENT_KINDS[i % len(EVENT_KINDS)], i)
        path = d / f"real.{ext}"
        BatchPump(rec, [sink_for_path(path)], start=False, max_batch=7).shutdown()
        out[ext] = path.read_bytes()
    return out


@TMP
@given(st.sampled_from(["parquet", "jsonl"]), st.data())
def test_damaged_real_event_files_never_crash_the_reader_when_fuzzed(tmp_path, real_files, ext, data):
    blob = bytearray(real_files[ext])
    how = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    if how == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] ^= data.draw(st.integers(1, 255))
    else:
        i = data.draw(st.integers(0, len(blob)))
        blob[i:i] = data.draw(st.binary(min_size=1, max_size=64))
    path = tmp_path / f"d.{ext}"
    path.write_bytes(bytes(blob))
    try:
        df = read_file(path, on_error="keep")
    except (FileNotFoundError, EventFileError) as e:  # keep mode raises nothing else
        pytest.fail(f"keep mode raised {e!r}")
    facts = df.attrs["kvscope"]["files"][0]
    assert _valid_kept_rows(df)
    assert len(df) <= 40 or not facts["readable"] or how != "truncate"


TRACE_ROW = {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}


@TMP
@given(st.lists(st.one_of(
    st.builds(lambda k, v: json.dumps({**TRACE_ROW, k: v}),
              st.sampled_from(sorted(TRACE_ROW)), json_scalars | st.lists(st.integers(-3, 5), max_size=3)),
    st.just(json.dumps(TRACE_ROW)),
    st.text(max_size=20).filter(lambda t: "\n" not in t)), min_size=1, max_size=8))
def test_mooncake_trace_reader_raises_only_its_named_error_when_fuzzed(tmp_path, lines):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    try:
        w = create_mooncake_workload(path, tokens_per_block=64)
        seen = 0
        while not w.is_exhausted() and seen < 100:
            now = w.next_arrival_s()
            seen += len(w.pop_arrivals(now if now is not None else 1e9))
    except TraceFormatError as e:
        assert str(path) in str(e)


@TMP
@given(members=st.lists(st.one_of(json_scalars, st.dictionaries(st.text(max_size=5), json_scalars, max_size=4)),
                        min_size=1, max_size=3))
def test_claude_trace_archive_members_of_garbage_are_input_errors_when_replayed(tmp_path, members, capsys):
    path = tmp_path / "t.tar.xz"
    with tarfile.open(path, "w:xz") as tar:
        for i, m in enumerate(members):
            data = json.dumps(m).encode()
            info = tarfile.TarInfo(f"traces/trace_{i:04d}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    code = main(["replay", "--trace", str(path), "--set", "max_requests=4", "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 0:
        assert json.loads(out)["engine_fatal"] is False or "trace" not in (json.loads(out)["fatal_message"] or "")
    else:
        assert code == 2 and len(err.strip().splitlines()) == 1 and str(path) in err


flags = st.sampled_from(["--json", "--html", "--set", "--events", "--trace", "--scenario", "--list-knobs",
                         "--stall-min-s", "--risk-horizon-s", "--remediation", "-x", "--", ""])
words = st.one_of(flags, st.text(max_size=12), st.sampled_from(["nan", "inf", "-1", "1e309", "oversize",
                                                               "max_requests=x", "seed=nan", "a=b=c", "/"]))


@TMP
@given(st.sampled_from(["analyze", "replay", "export", "check"]), st.lists(words, max_size=5))
def test_cli_arguments_give_one_line_or_a_result_never_a_traceback_when_fuzzed(tmp_path, capsys, monkeypatch,
                                                                                command, argv):
    assume(command != "replay" or "--list-knobs" in argv or "--scenario" not in argv)  # no full replays
    assume(command != "export" or not argv or argv[0].startswith("-"))  # no collector calls
    monkeypatch.chdir(tmp_path)
    try:
        code = main([command, *argv])
    except SystemExit as e:  # argparse: usage error (2) or --help (0)
        code = e.code
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    assert code in (0, 1, 2, 141), (code, err)
    if code == 2 and err:
        assert len([line for line in err.splitlines() if line.startswith("kvscope")]) <= 1


env_values = st.one_of(st.text(max_size=15), st.sampled_from(["jsonl", "zmq,jsonl", "parquet,otlp", "model", "auto",
                                                              "0", "-1", "tcp://x:1", "/proc/x"]))


@TMP
@given(st.dictionaries(st.sampled_from(["KVSCOPE_SINKS", "KVSCOPE_ENGINE", "KVSCOPE_RANK", "KVSCOPE_ZMQ_ENDPOINT",
                                        "KVSCOPE_OUTPUT_DIR", "KVSCOPE_DISABLE"]), env_values, max_size=6))
def test_instrument_environment_is_checked_without_crashing_when_fuzzed(tmp_path, monkeypatch, env):
    # check_env creates a missing output folder (the launcher writes there next); a fuzzed relative
    # name must land in the test's folder, never in the checkout the suite runs from.
    monkeypatch.chdir(tmp_path)
    env = dict(env)
    env.setdefault("KVSCOPE_OUTPUT_DIR", "/tmp/kvscope-fuzz-out")
    problems = check_env(env)
    assert all(isinstance(p, str) and "\n" not in p for p in problems)
    sinks = [s.strip() for s in env.get("KVSCOPE_SINKS", "jsonl").split(",") if s.strip()]
    if any(s not in ("jsonl", "parquet", "zmq", "otlp") for s in sinks) or not sinks:
        assert any("sink" in p for p in problems)
    if env.get("KVSCOPE_ENGINE", "auto") not in ("auto", "tensorrt_llm", "model"):
        assert any("ENGINE" in p for p in problems)
