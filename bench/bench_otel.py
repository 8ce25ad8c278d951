"""OpenTelemetry export: end-to-end throughput to a local collector, and engine-thread cost.

Needs the rotel collector installed by tests/setup.d/20-otel-stack.sh (``make test`` runs it); the
bench starts its own rotel on free ports (all signals to rotel's blackhole exporter, so the figure
is kvscope's side of the pipe) and stops it at the end.

Measured here: ``kvscope export`` of a recorded synthetic incident (event file -> spans, metric
snapshots, logs -> OTLP gRPC and HTTP -> rotel): events/s, and what was dropped. The engine-thread
cost of export (in process and out of process) and the live stream's end-to-end rate are measured
by bench_follow.py with the helpers below.

Figures, with their run date: bench/RESULTS.md.
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvscope.app.file_export import export_files
from kvscope.otel import OtlpConfig
from kvscope.recording import BatchPump, Recorder, read_file, sink_for_path
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, file_meta, record_incident

ROOT = Path(__file__).resolve().parents[1]
STACK = Path(os.environ.get("KVSCOPE_OTEL_STACK", ROOT / ".cache" / "otel-stack"))
SHAPE = IncidentShape(num_requests=3000, fail=False)
ENGINE_SHAPE = IncidentShape(num_requests=2000, fail=False)
ROUNDS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rotel(run: Path) -> tuple[subprocess.Popen, int, int]:
    agents = glob.glob(str(STACK / "rotel-venv/lib/python3*/site-packages/rotel/rotel-agent"))
    if not agents:
        raise SystemExit(f"rotel not installed under {STACK}: run tests/setup.d/20-otel-stack.sh")
    g, h = free_port(), free_port()
    env = {**os.environ, "ROTEL_EXPORTERS": "bh:blackhole", "ROTEL_EXPORTERS_TRACES": "bh",
           "ROTEL_EXPORTERS_METRICS": "bh", "ROTEL_EXPORTERS_LOGS": "bh"}  # fmt: skip
    log = open(run / "rotel.log", "wb")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen(
        [agents[0], "start", "--otlp-grpc-endpoint", f"127.0.0.1:{g}", "--otlp-http-endpoint", f"127.0.0.1:{h}"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", g)) == 0 and s.connect_ex(("127.0.0.1", h)) == 0:
                break
        time.sleep(0.02)
    return proc, g, h


def write_incident(path: Path, shape: IncidentShape) -> int:
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated", capacity=1 << 22)
    pump = BatchPump(rec, [sink_for_path(path, meta=file_meta(shape))], start=False)
    record_incident(rec, clock, shape)
    pump.shutdown()
    return len(read_file(path))


def bench_export(path: Path, config: OtlpConfig) -> tuple[float, dict]:
    t = time.perf_counter()
    s = export_files([str(path)], config)
    return s["events"] / (time.perf_counter() - t), s


class PacedClock(FakeClock):
    """Each scheduler iteration also spends ``pause_s`` outside the GIL (the forward pass)."""

    def __init__(self, pause_s: float) -> None:
        super().__init__()
        self.pause_s = pause_s

    def advance(self, ns: int) -> None:
        super().advance(ns)
        if self.pause_s:
            time.sleep(self.pause_s)


def start_follower(endpoint: str, grpc_port: int, *, analyze: bool = True, extra: list[str] | None = None
                   ) -> subprocess.Popen:
    """``kvscope export --follow`` in its own process (the out-of-process export path); it ends at
    the publisher's END message (its clean shutdown)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kvscope", "export", "--follow", endpoint, "--otlp-endpoint",
         f"http://127.0.0.1:{grpc_port}", "--protocol", "grpc", "--metric-interval", "60", "--idle-exit", "30",
         "--json", *([] if analyze else ["--no-analyze"]), *(extra or [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)  # fmt: skip


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        proc, g, h = start_rotel(run)
        try:
            path = run / "incident.parquet"
            n = write_incident(path, SHAPE)
            print(
                f"export e2e: {n:,} events ({SHAPE.num_requests:,} requests) -> rotel (blackhole)"
            )
            for proto, port in (("grpc", g), ("http/protobuf", h)):
                best, summary = 0.0, {}
                for _ in range(ROUNDS):
                    rate, summary = bench_export(
                        path, OtlpConfig(f"http://127.0.0.1:{port}", proto)
                    )
                    best = max(best, rate)
                print(
                    f"  {proto:<14} {best:10,.0f} events/s   spans {summary['spans']['exported']:,} "
                    f"metric points {summary['metric_points']['exported']:,} dropped {summary['dropped_total']}"
                )
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
