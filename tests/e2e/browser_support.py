"""Start JupyterLab or Voila on a scratch copy of a notebook and open it in Debian's Chromium.

Recipe and pitfalls: ../shared/recipes/jupyter-browser.md (root needs allow_root; Lab needs
auto-start-kernel and no-news settings; Playwright must use /usr/bin/chromium with a fresh profile
through launch_persistent_context; the server runs in its own process group, killed as a group).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
TOKEN = "kvscope-e2e"
LAB_SETTINGS = {
    # windowingMode "none": every cell's output renders at once. Lab's default ("defer") renders
    # cells below the fold when the page is idle, which a loaded CI machine may postpone past the
    # test's waits (a clean-clone run timed out waiting for the pools figure below the fold).
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True,
                                                                   "windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}


@dataclass
class Server:
    mode: str
    port: int
    url: str
    log: Path
    proc: subprocess.Popen

    def api(self, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}?token={TOKEN}", timeout=30) as r:
            return json.load(r)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyter_server(mode: str, notebook: Path, run_dir: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    """JupyterLab (``mode="lab"``) or Voila serving a copy of ``notebook``; stopped on exit."""
    bin_dir = Path(sys.executable).parent
    nbdir = run_dir / "nb"
    nbdir.mkdir(parents=True)
    shutil.copy(notebook, nbdir / notebook.name)
    full_env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    JUPYTER_CONFIG_DIR=str(run_dir / ".jupyter"), JUPYTER_RUNTIME_DIR=str(run_dir / ".runtime"),
                    JUPYTERLAB_SETTINGS_DIR=str(run_dir / ".lab-settings"),
                    JUPYTERLAB_WORKSPACES_DIR=str(run_dir / ".lab-ws"), IPYTHONDIR=str(run_dir / ".ipython"),
                    **(env or {}))
    for rel, data in LAB_SETTINGS.items():
        target = run_dir / ".lab-settings" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data))
    port = _free_port()
    root = ["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []
    if mode == "lab":
        cmd = [str(bin_dir / "jupyter-lab"), "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", "--ServerApp.open_browser=False",
               f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={nbdir}", *root]
        url = f"http://127.0.0.1:{port}/lab/tree/{notebook.name}?reset&token={TOKEN}"
        ready = f"http://127.0.0.1:{port}/api/status?token={TOKEN}"
    else:
        cmd = [str(bin_dir / "voila"), str(nbdir / notebook.name), "--no-browser", "--Voila.ip=127.0.0.1",
               f"--port={port}", f"--token={TOKEN}"]
        url = f"http://127.0.0.1:{port}/?token={TOKEN}"
        ready = f"http://127.0.0.1:{port}/voila/static/voila.js"
    log = run_dir / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=full_env, cwd=nbdir, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 240  # generous: a busy machine starts Jupyter slowly
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{mode} server exited rc={proc.returncode}: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(ready, timeout=2)
                break
            except urllib.error.HTTPError:
                break  # any HTTP answer: the server is up
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mode} server not ready after 240 s: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield Server(mode, port, url, log, proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its kernels (own process group)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def chromium_page(profile_dir: Path, *, width: int = 1280, height: int = 1000):
    """A Playwright page in Debian's Chromium (fresh profile); yields (page, console_errors)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height})
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            errors: list[str] = []
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page, errors
        finally:
            ctx.close()


def run_all_in_lab(page, server: Server) -> None:
    """Wait for the notebook's kernel, then Run > Run All Cells through the menu bar."""
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=180_000)
    deadline = time.monotonic() + 180
    while not any(s["kernel"]["execution_state"] == "idle" for s in server.api("/api/sessions")):
        dialog = page.locator(".jp-Dialog button", has_text="Select")
        if dialog.count():
            dialog.first.click()
        if time.monotonic() > deadline:
            raise TimeoutError("kernel did not start")
        time.sleep(0.2)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()


# Every text label plotly draws outside the plot area's data: annotations (finding and mode-change
# labels, panel titles), the figure title, axis titles and legend entries all live in the figure's
# info layer. Tick labels are left out: plotly lays those out itself.
_LABEL_BOXES_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map((plot, i) => {
  const name = [...plot.classList].find(c => c.startsWith('kvscope-fig-')) || `figure ${i}`;
  const labels = [...plot.querySelectorAll('.infolayer text')].map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent.trim(), left: r.left, top: r.top, right: r.right, bottom: r.bottom};
  }).filter(b => b.text && b.right > b.left && b.bottom > b.top);
  return {name, labels};
})"""


def overlapping_labels(page, *, tolerance_px: float = 1.0) -> list[str]:
    """Pairs of text labels of one plotly figure on ``page`` whose boxes overlap by more than
    ``tolerance_px`` both across and down (read from the rendered SVG); empty when none do."""
    found: list[str] = []
    for fig in page.evaluate(_LABEL_BOXES_JS):
        boxes = fig["labels"]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                dx = min(a["right"], b["right"]) - max(a["left"], b["left"])
                dy = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
                if dx > tolerance_px and dy > tolerance_px:
                    found.append(f"{fig['name']}: {a['text']!r} overlaps {b['text']!r} by {dx:.0f}x{dy:.0f} px")
    return found
