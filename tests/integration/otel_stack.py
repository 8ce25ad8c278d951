"""Start, query and stop the real OpenTelemetry stack installed by tests/setup.d/20-otel-stack.sh.

rotel (OTLP collector) routes traces -> Arize Phoenix, metrics -> VictoriaMetrics (OTLP ingestion),
logs -> its own debug log; Prometheus 2.42 scrapes an opentelemetry-exporter-prometheus endpoint.
Every server listens on 127.0.0.1 on a free port picked at start (so parallel runs on one machine
do not collide) and is stopped by the process handle it was started with.
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
STACK = Path(os.environ.get("KVSCOPE_OTEL_STACK", ROOT / ".cache" / "otel-stack"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, what: str, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if check():
                return
        except (requests.RequestException, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f}s")


def _tcp_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class OtelStack:
    """The four servers, their ports and read-back helpers."""

    def __init__(self, run_dir: Path) -> None:
        missing = [
            p for p in ("rotel-venv/.ok", "phoenix-venv/.ok", "obs/.ok") if not (STACK / p).exists()
        ]
        if missing:
            raise RuntimeError(
                f"OTel stack not installed under {STACK} (missing {', '.join(missing)}): "
                "run tests/setup.d/20-otel-stack.sh (make test does)"
            )
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        names = ("grpc", "http", "phoenix", "phoenix_grpc", "vm", "prom", "scrape")
        self.ports = {k: free_port() for k in names}
        self.procs: dict[str, subprocess.Popen] = {}

    # ---- endpoints --------------------------------------------------------------------------------
    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['grpc']}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def rotel_log(self) -> Path:
        return self.run_dir / "rotel.log"

    # ---- processes --------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        out = open(self.run_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        self.procs[name] = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=self.run_dir,
        )
        out.close()

    def start(self) -> None:
        p, r = self.ports, self.run_dir
        (r / "scrape.yml").write_text(
            "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: kvscope\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{p['scrape']}']}}]\n"
        )
        self._spawn(
            "phoenix",
            [str(STACK / "phoenix-venv/bin/phoenix"), "serve"],
            {
                "PHOENIX_HOST": "127.0.0.1",
                "PHOENIX_PORT": str(p["phoenix"]),
                "PHOENIX_GRPC_PORT": str(p["phoenix_grpc"]),
                "PHOENIX_WORKING_DIR": str(r / "phoenix"),
                "PHOENIX_TELEMETRY_ENABLED": "false",
            },
        )
        self._spawn(
            "vm",
            [
                str(STACK / "obs/vm/usr/bin/victoria-metrics"),
                f"-httpListenAddr=127.0.0.1:{p['vm']}",
                f"-storageDataPath={r / 'vm'}",
                "-retentionPeriod=1d",
                "-search.latencyOffset=1s",
                "-opentelemetry.usePrometheusNaming",
            ],
        )
        self._spawn(
            "prom",
            [
                str(STACK / "obs/prom/usr/bin/prometheus"),
                f"--config.file={r / 'scrape.yml'}",
                f"--storage.tsdb.path={r / 'prom'}",
                f"--web.listen-address=127.0.0.1:{p['prom']}",
            ],
        )
        self.start_collector()
        _wait(lambda: requests.get(f"{self.vm_url}/health", timeout=1).ok, "victoriametrics", 120)
        _wait(lambda: requests.get(f"{self.prom_url}/-/ready", timeout=1).ok, "prometheus", 120)
        _wait(lambda: requests.get(f"{self.phoenix_url}/healthz", timeout=1).ok, "phoenix", 240)
        _wait(lambda: _tcp_open(p["phoenix_grpc"]), "phoenix grpc", 30)

    def start_collector(self) -> None:
        p = self.ports
        rotel = glob.glob(str(STACK / "rotel-venv/lib/python3*/site-packages/rotel/rotel-agent"))[0]
        env = {
            "ROTEL_EXPORTERS": "phx:otlp,vm:otlp,bh:blackhole",
            "ROTEL_EXPORTER_PHX_ENDPOINT": f"http://127.0.0.1:{p['phoenix_grpc']}",
            "ROTEL_EXPORTER_PHX_PROTOCOL": "grpc",
            "ROTEL_EXPORTER_VM_ENDPOINT": f"http://127.0.0.1:{p['vm']}/opentelemetry",
            "ROTEL_EXPORTER_VM_PROTOCOL": "http",
            "ROTEL_EXPORTERS_TRACES": "phx",
            "ROTEL_EXPORTERS_METRICS": "vm",
            "ROTEL_EXPORTERS_LOGS": "bh",
        }
        self._spawn(
            "rotel",
            [
                rotel,
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{p['grpc']}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{p['http']}",
                "--batch-timeout",
                "100ms",
                "--debug-log",
                "logs",
                "--debug-log-verbosity",
                "detailed",
            ],
            env,
        )
        _wait(lambda: _tcp_open(p["grpc"]) and _tcp_open(p["http"]), "rotel", 60)

    def kill_collector(self) -> None:
        proc = self.procs.pop("rotel")
        proc.kill()
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            del self.procs[name]

    # ---- read back ---------------------------------------------------------------------------------
    @property
    def phoenix_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['phoenix']}"

    @property
    def vm_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['vm']}"

    @property
    def prom_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prom']}"

    def phoenix_spans(self, project: str = "default", limit: int = 1000) -> list[dict]:
        url = f"{self.phoenix_url}/v1/projects/{project}/spans"
        r = requests.get(url, params={"limit": limit}, timeout=30)
        if r.status_code == 404:  # the project appears with its first span
            return []
        r.raise_for_status()
        return r.json()["data"]

    def phoenix_request_spans(self, project: str, expected: int, timeout_s: float = 60.0) -> dict[int, dict]:
        """``project``'s request spans by request id, polled until ``expected`` of them are in (what
        is there on timeout). Phoenix ingests asynchronously: counting every span would stop early,
        with child spans in and request spans still on their way."""
        from kvscope.otel import names as n

        def request_spans() -> dict[int, dict]:
            spans = self.phoenix_spans(project)
            return {sp["attributes"][n.REQUEST_ID]: sp for sp in spans if sp["name"] == n.SPAN_REQUEST}

        def complete() -> dict[int, dict] | None:
            found = request_spans()
            return found if len(found) >= expected else None

        return poll(complete, timeout_s) or request_spans()

    def vm_query(self, query: str, at_s: float | None = None) -> list[dict]:
        requests.get(f"{self.vm_url}/internal/force_flush", timeout=30)
        params = {"query": query}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        r = requests.get(f"{self.vm_url}/api/v1/query", params=params, timeout=30)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def vm_value(self, metric: str, *, service: str, at_s: float, **labels: object) -> float | None:
        """The one sample of ``metric`` for ``service`` with ``labels`` at ``at_s``; None unless exactly
        one series matches."""
        sel = ",".join([f'service_name="{service}"'] + [f'{k}="{v}"' for k, v in labels.items()])
        res = self.vm_query(metric + "{" + sel + "}", at_s=at_s)
        return float(res[0]["value"][1]) if len(res) == 1 else None

    def vm_export(self, match: str, start_s: float, end_s: float) -> list[dict]:
        """Raw samples (values with their own timestamps) of every series matching ``match``."""
        import json

        requests.get(f"{self.vm_url}/internal/force_flush", timeout=30)
        params = {"match[]": match, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}"}
        r = requests.get(f"{self.vm_url}/api/v1/export", params=params, timeout=30)
        r.raise_for_status()
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]

    def prom_query(self, query: str) -> list[dict]:
        r = requests.get(f"{self.prom_url}/api/v1/query", params={"query": query}, timeout=30)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def diagnose(self) -> str:
        """What the backends hold and the collector's last words (for assertion messages)."""
        try:
            projects = requests.get(f"{self.phoenix_url}/v1/projects", timeout=30).json()
        except (requests.RequestException, ValueError) as e:
            projects = repr(e)
        tail = self.rotel_log_text()[-1500:]
        return f"phoenix projects={projects}; rotel.log tail: {tail}"

    def rotel_log_text(self) -> str:
        return self.rotel_log.read_text(errors="replace") if self.rotel_log.exists() else ""


def poll(fn, timeout_s: float = 60.0, interval_s: float = 0.2):
    """Call ``fn`` until it returns something truthy; return that (or the last value on timeout)."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout_s:
        try:
            last = fn()
        except requests.RequestException:
            last = None
        if last:
            return last
        time.sleep(interval_s)
    return last
