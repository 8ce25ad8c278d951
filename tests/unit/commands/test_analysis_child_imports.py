"""The analyzer child of ``export --follow`` (and anything else that only streams) starts without
pandas, pyarrow or OpenTelemetry: each would add a large share of its start-up. Checked in a fresh
interpreter, since this test process has imported them all already."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pandas", "pyarrow", "opentelemetry", "plotly")

_HEAVY_LOADED = f"sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))"

# The child's own loop, run in this interpreter's main thread (it sets a signal handler) on a real
# incident's rows: whatever it imports on the way to its findings is in sys.modules afterwards.
_SERVE_AN_INCIDENT = f"""
import json, sys, threading
from multiprocessing.connection import Pipe

from kvscope.app.analysis_process import _serve
from kvscope.recording import Recorder
from kvscope.recording.wire import encode_rows
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, record_incident

clock = FakeClock()
rec = Recorder(clock=clock, clock_name="simulated", capacity=1 << 20)
record_incident(rec, clock, IncidentShape(num_requests=60))
raw = rec.drain_raw()
child_in, to_child = Pipe(duplex=False)
from_child, child_out = Pipe(duplex=False)
answers = []

def parent():
    to_child.send((0, 0, len(raw), encode_rows(raw)))
    answers.append(from_child.recv())
    to_child.send(None)
    answers.append(from_child.recv())

t = threading.Thread(target=parent, daemon=True)  # a failing _serve ends the interpreter
t.start()
_serve(child_in, child_out, ("target", "draft"), (50_000, 50, 1000))
t.join()
kinds = sorted({{r.kind for findings, _gauges in answers for r in findings}})
print(json.dumps({{"kinds": kinds, "heavy": {_HEAVY_LOADED}}}))
"""


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_analyzer_child_raises_its_findings_without_pandas_pyarrow_or_opentelemetry():
    got = _run(_SERVE_AN_INCIDENT)
    assert {"engine_fatal", "time_to_exhaustion"} <= set(got["kinds"])  # the rules ran on the incident
    assert got["heavy"] == []


@pytest.mark.parametrize("module", ["kvscope.analysis.streaming", "kvscope.analysis",
                                    "kvscope.app.analysis_process", "kvscope.otel.finding_record",
                                    "kvscope.recording.wire", "kvscope.recording.recorder"])
def test_a_streaming_module_imports_no_pandas_when_imported_alone(module):
    got = _run(f"import json, sys, {module}; print(json.dumps({{'heavy': {_HEAVY_LOADED}}}))")
    assert got["heavy"] == []


def test_the_batch_names_still_load_from_the_package_when_read():
    code = ("import json, sys\n"
            "from kvscope.analysis import *\n"
            "from kvscope.recording import *\n"
            "from kvscope.otel import *\n"
            "print(json.dumps({'analyze': analyze.__module__, 'frame': read_frame.__module__,"
            f" 'sink': OtelSink.__module__, 'heavy': {_HEAVY_LOADED}}}))")
    got = _run(code)
    assert (got["analyze"], got["frame"], got["sink"]) == (
        "kvscope.analysis.analyzer", "kvscope.recording.reader", "kvscope.otel.sink")
    assert {"pandas", "pyarrow", "opentelemetry"} <= set(got["heavy"])
