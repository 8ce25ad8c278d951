"""The stream dashboard of 02_live_dashboard.ipynb in JupyterLab in Debian's Chromium, on a real
engine process (``kvscope-instrument --sinks zmq`` around a paced glm5-dsa replay, remediation in
shadow through ``KVSCOPE_REMEDIATION``): the engine is SIGKILLed mid-run (no END), then restarted on the same endpoint.

Checks from the DOM that the dashboard shows wall-clock times for the real-clock stream, the
remediation mode the engine reported (read-only; also for a dashboard opened on an engine that has
been running, from the stream's header), that the killed engine reads ``silent`` (not ``running``)
with its last event's time, and that the restarted engine's refusal says what to do.
Screenshots go to ``$KVSCOPE_E2E_SHOTS`` (default: the test's tmp dir), pass or fail.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("playwright")
if not Path("/usr/bin/chromium").exists():  # installed by tests/setup.d/30-browser.sh
    pytest.skip("Debian chromium missing: run tests/setup.d/30-browser.sh", allow_module_level=True)

from browser_support import chromium_page, jupyter_server, run_all_in_lab  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_live_dashboard.ipynb"
BIN = Path(sys.executable).parent
UTC = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine(run_dir: Path, endpoint: str, tag: str, sinks: str = "zmq", dies_soon: bool = True) -> subprocess.Popen:
    """A paced glm5-dsa replay publishing on ``endpoint``. ``dies_soon``: the start-up burst
    (sessions 1.19 s apart), where the engine dies about 35 simulated seconds in, 70 s of wall time
    at this pace; else the scenario's 10 s ramp, where it dies about 285 simulated seconds in (570 s
    of wall time, later still on a busy machine, where the replay falls behind its pace)."""
    burst = ["--set", "session_start_interval_s=-1"] if dies_soon else []
    return subprocess.Popen(
        [str(BIN / "kvscope-instrument"), "--output-dir", str(run_dir / f"ev-{tag}"),
         "--sinks", sinks, "--zmq-endpoint", endpoint, str(BIN / "kvscope"), "replay", "--scenario", "glm5-dsa",
         "--set", "pace=0.5", *burst],
        env={**os.environ, "KVSCOPE_REMEDIATION": "shadow"},  # attached by kvscope-instrument itself
        stdout=open(run_dir / f"engine-{tag}.out", "w"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGKILL) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, sig)
        proc.wait(30)


def test_stream_dashboard_says_silent_for_a_killed_engine_and_what_to_do_for_a_restarted_one(tmp_path):
    shots = Path(os.environ.get("KVSCOPE_E2E_SHOTS", tmp_path / "shots"))
    shots.mkdir(parents=True, exist_ok=True)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    first = second = None
    with jupyter_server("lab", NOTEBOOK, tmp_path, env={"KVSCOPE_LIVE_ENDPOINT": endpoint}) as server, \
            chromium_page(tmp_path / "profile", width=1400, height=4000) as (page, errors):
        stream = page.locator(".kvscope-dashboard").nth(1)

        def shot(name: str) -> None:
            stream.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            stream.screenshot(path=str(shots / name))
            print(f"screenshot: {shots / name}")

        try:
            page.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
            run_all_in_lab(page, server)
            stream.wait_for(timeout=120_000)
            status = stream.locator(".kvscope-status")
            # It must still be running when it is killed below, however slowly the checks before
            # pass on a busy machine: the ramp, not the burst that dies 70 s in.
            first = _engine(tmp_path, endpoint, "a", dies_soon=False)

            # A real clock: the status line, the counters and the axes read wall-clock time.
            expect(status).to_have_class(re.compile(r"kvscope-state-running"), timeout=180_000)
            expect(status).to_contain_text(re.compile("latest event " + UTC), timeout=90_000)
            expect(stream.locator(".kvscope-counters")).to_contain_text(re.compile(r"\(" + UTC + r"\)"))
            plot = stream.locator(".js-plotly-plot.kvscope-fig-pools").first
            expect(plot).to_contain_text("time (UTC, wall clock)", timeout=60_000)
            expect(plot.locator(".xaxislayer-above text").first).to_have_text(re.compile(r"^\d\d:\d\d:\d\d$"),
                                                                              timeout=30_000)
            expect(stream.locator(".kvscope-findings")).to_contain_text("wall clock")
            # The remediation mode the engine reports, read-only (not a made-up "off").
            shadow = stream.locator(".kvscope-remediation button", has_text=re.compile(r"^\s*shadow\s*$"))
            expect(shadow).to_have_class(re.compile(r"\bmod-active\b"), timeout=30_000)
            expect(shadow).to_be_disabled()
            expect(status).to_contain_text("remediation shadow (as reported)")
            page.wait_for_timeout(8000)  # some run time on the axes
            shot("fixed-stream-running.png")

            # SIGKILL: no END. Within the default 10 s of silence the status says so.
            _stop(first)
            expect(status).to_have_class(re.compile(r"kvscope-state-silent"), timeout=90_000)
            expect(status).to_contain_text(re.compile(r"silent for \d+ s: the engine may have died"))
            expect(status).to_contain_text(re.compile("last event at " + UTC))
            shot("fixed-stream-after-kill.png")

            # The engine restarts on the same endpoint (a new run): refused, and it says what to do.
            second = _engine(tmp_path, endpoint, "b", dies_soon=False)
            expect(status).to_have_class(re.compile(r"kvscope-state-error"), timeout=180_000)
            expect(status).to_contain_text("The figures below are the previous run's")
            expect(status).to_contain_text(f"re-run stream_dashboard('{endpoint}')")
            shot("fixed-stream-after-restart.png")

            # The in-kernel replay above runs on the simulated clock: its seconds are kept.
            replay_plot = page.locator(".kvscope-dashboard").nth(0).locator(".js-plotly-plot.kvscope-fig-pools")
            expect(replay_plot.first).to_contain_text("time (s, event clock)")
        except Exception:
            page.screenshot(path=str(shots / "fixed-stream-failure.png"), full_page=True)
            print("browser console errors:", errors[:10])
            print("server log tail:", server.log.read_text()[-3000:])
            raise
        finally:
            _stop(first)
            _stop(second)


@pytest.mark.parametrize("sinks", ["zmq", "jsonl,zmq"], ids=["stream-only", "file-beside"])
def test_a_dashboard_opened_on_a_running_engine_shows_the_remediation_mode_in_force(tmp_path, sinks):
    """The on-call case: the engine (remediation shadow) has been running and publishing before the
    dashboard subscribes, so the mode change's event is long gone from the stream. Stream only: the
    stream's header says the mode in force, and the read-only widgets show it instead of "not
    reported"; the findings table says analysis is off (the pool configuration was missed), never
    "no findings yet". With the engine's event file beside the stream: the dashboard reads what it
    missed from there, and its findings cover the run, up to the engine's crash."""
    shots = Path(os.environ.get("KVSCOPE_E2E_SHOTS", tmp_path / "shots"))
    shots.mkdir(parents=True, exist_ok=True)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    engine = _engine(tmp_path, endpoint, "late", sinks)
    try:
        with jupyter_server("lab", NOTEBOOK, tmp_path, env={"KVSCOPE_LIVE_ENDPOINT": endpoint}) as server, \
                chromium_page(tmp_path / "profile", width=1400, height=4000) as (page, errors):
            stream = page.locator(".kvscope-dashboard").nth(1)
            try:
                page.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
                run_all_in_lab(page, server)  # the engine has published for a while by now
                stream.wait_for(timeout=120_000)
                status = stream.locator(".kvscope-status")
                expect(status).to_have_class(re.compile(r"kvscope-state-running"), timeout=90_000)
                # it joined late: the engine was past its first iterations (and its mode change)
                expect(stream.locator(".kvscope-counters")).to_contain_text(re.compile(r"iteration ([2-9]\d|\d{3,})"))
                shadow = stream.locator(".kvscope-remediation button", has_text=re.compile(r"^\s*shadow\s*$"))
                expect(shadow).to_have_class(re.compile(r"\bmod-active\b"), timeout=30_000)
                expect(shadow).to_be_disabled()
                expect(status).to_contain_text("remediation shadow (as reported)")
                expect(stream.locator(".kvscope-remediation")).not_to_contain_text("not reported")
                findings = stream.locator(".kvscope-findings")
                if sinks == "zmq":
                    expect(findings).to_contain_text("Analysis off: joined the engine after it started")
                    expect(findings).not_to_contain_text("no findings yet")
                else:
                    expect(status).to_contain_text(re.compile(r"and the [\d,]+ published before it subscribed, "
                                                              r"read from the engine's event file"), timeout=30_000)
                    # glm5-dsa dies of its draft pool: the findings, read from the run's start, say so
                    expect(status).to_have_class(re.compile(r"kvscope-state-engine-fatal"), timeout=180_000)
                    expect(findings.locator("tr.kvscope-finding", has_text="critical").first).to_be_attached(
                        timeout=30_000)
                    expect(findings).not_to_contain_text("Analysis off")
                tag = sinks.replace(",", "-")
                stream.scroll_into_view_if_needed()
                page.wait_for_timeout(500)
                stream.screenshot(path=str(shots / f"late-join-{tag}.png"))
                print(f"screenshot: {shots / f'late-join-{tag}.png'}")
            except Exception:
                page.screenshot(path=str(shots / f"late-join-{sinks.replace(',', '-')}-failure.png"), full_page=True)
                print("browser console errors:", errors[:10])
                print("server log tail:", server.log.read_text()[-3000:])
                raise
    finally:
        _stop(engine)
