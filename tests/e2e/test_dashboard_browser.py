"""The live dashboard in a real browser: 02_live_dashboard.ipynb in Voila and in JupyterLab, in
Debian's Chromium driven by Playwright.

The notebook starts a ``shared-prefix`` replay at pace 0.25 when the page shows the dashboard (it
would crash after ~12 simulated seconds, ~45 s of wall time). The test watches the pool figure render and grow, clicks the
remediation switch to ``on`` with the mouse, and checks from the DOM that the switch changed, that
the remediation held requests back (deferrals or reserved blocks), and that the replay finished
without the engine's fatal error. Then no two text labels of one figure overlap (their boxes read
from the rendered SVG), and a 1280x800 screen from the dashboard's top is saved; with
``KVSCOPE_UPDATE_README_PICTURE=1`` Voila's becomes the README picture (notebooks/dashboard.png).
A second test holds the plotting library's first load in the browser: the dashboard says which
chart did not render and why, rebuilds it, and it draws without a reload.
Screenshots go to tests/artifacts/ (printed), pass or fail.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("playwright")
if not Path("/usr/bin/chromium").exists():  # installed by tests/setup.d/30-browser.sh
    pytest.skip("Debian chromium missing: run tests/setup.d/30-browser.sh", allow_module_level=True)

from browser_support import chromium_page, jupyter_server, overlapping_labels, run_all_in_lab  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_live_dashboard.ipynb"
ARTIFACTS = ROOT / "tests" / "artifacts"
README_PICTURE = ROOT / "notebooks" / "dashboard.png"

POINTS_JS = """el => (el.data || []).reduce((n, t) => n + (t.x ? t.x.length : 0), 0)"""


def _count(page, selector: str) -> int:
    text = page.locator(selector).inner_text()
    digits = re.findall(r"[\d,]+", text)
    return int(digits[0].replace(",", "")) if digits else 0


def _shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


@pytest.mark.parametrize("mode", ["voila", "lab"])
def test_remediation_switch_clicked_mid_run_ends_the_replay_without_the_fatal_error_when_viewed_in_chromium(
        mode, tmp_path):
    with jupyter_server(mode, NOTEBOOK, tmp_path) as server, chromium_page(tmp_path / "profile") as (page, errors):
        try:
            page.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
            if mode == "lab":
                run_all_in_lab(page, server)
            plot = page.locator(".js-plotly-plot.kvscope-fig-pools").first
            plot.locator(".main-svg").first.wait_for(state="attached", timeout=120_000)
            status = page.locator(".kvscope-status")
            expect(status).to_have_class(re.compile(r"kvscope-state-running"), timeout=60_000)

            # The pool figure renders and grows while the replay runs.
            expect(plot.locator(".scatterlayer .trace").first).to_be_visible(timeout=60_000)
            first = plot.evaluate(POINTS_JS)
            deadline = time.monotonic() + 30
            while plot.evaluate(POINTS_JS) <= first and time.monotonic() < deadline:
                page.wait_for_timeout(250)
            grown = plot.evaluate(POINTS_JS)
            assert grown > first, f"pool figure did not grow: {first} -> {grown} points"
            assert "engine fatal" not in status.inner_text()

            # A real mouse click on the remediation switch.
            on = page.locator(".kvscope-remediation button", has_text=re.compile(r"^\s*on\s*$"))
            expect(on).to_be_enabled(timeout=10_000)
            on.click()
            expect(on).to_have_class(re.compile(r"\bmod-active\b"), timeout=10_000)
            expect(status).to_contain_text("remediation on", timeout=10_000)
            # ... and the controller applied it (its mode change is drawn where it took effect).
            expect(plot).to_contain_text("remediation on", timeout=30_000)
            _shot(page, f"dashboard-{mode}-running.png")

            # The replay runs to its end without the engine's fatal error.
            expect(status).to_have_class(re.compile(r"kvscope-state-(finished|engine-fatal)"), timeout=150_000)
            page.wait_for_timeout(1500)  # the last refresh
            _shot(page, f"dashboard-{mode}-finished.png")
            assert "kvscope-state-finished" in (status.get_attribute("class") or ""), status.inner_text()
            held = _count(page, ".kvscope-count-deferrals") + _count(page, ".kvscope-count-reservations")
            assert held > 0, page.locator(".kvscope-counters").inner_text()
            assert "engine fatal" not in plot.inner_text()
            assert page.locator(".kvscope-findings .kvscope-finding").count() > 0  # the table grew

            # What a person sees first on a laptop screen: every label legible, none printed over another.
            page.set_viewport_size({"width": 1280, "height": 800})
            page.locator(".kvscope-dashboard").first.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(1500)  # plotly's relayout to the new size
            first_screen = ARTIFACTS / f"dashboard-{mode}-1280x800.png"
            page.screenshot(path=str(first_screen))
            print(f"screenshot: {first_screen}")
            overlaps = overlapping_labels(page)
            assert not overlaps, "\n".join(overlaps)
            if mode == "voila" and os.environ.get("KVSCOPE_UPDATE_README_PICTURE") == "1":
                shutil.copyfile(first_screen, README_PICTURE)
                print(f"README picture updated: {README_PICTURE}")
        except Exception:
            _shot(page, f"dashboard-{mode}-failure.png")
            print("browser console errors:", errors[:10])
            print("server log tail:", server.log.read_text()[-3000:])
            raise


# Holds the first plotly bundle the page imports (anywidget imports a widget's code from a blob URL)
# for ten minutes: a module that awaits that long, then re-exports the bundle. Later imports run as usual.
DELAY_PLOTLY_JS = """(() => {
  const create = URL.createObjectURL.bind(URL);
  window.kvscopeDelayedImports = 0;
  URL.createObjectURL = (blob) => {
    const url = create(blob);
    if (window.kvscopeDelayedImports === 0 && blob instanceof Blob && blob.type === "text/javascript"
        && blob.size > 1000000) {
      window.kvscopeDelayedImports += 1;
      const held = `await new Promise(r => setTimeout(r, 600000));\\nexport * from "${url}";\\n`
                   + `export { default } from "${url}";\\n`;
      return create(new Blob([held], { type: "text/javascript" }));
    }
    return url;
  };
})();"""


def test_a_chart_whose_plotting_library_loads_late_is_reported_and_drawn_again_when_viewed_in_chromium(tmp_path):
    with jupyter_server("voila", NOTEBOOK, tmp_path) as server, chromium_page(tmp_path / "profile") as (page, errors):
        try:
            page.add_init_script(script=DELAY_PLOTLY_JS)
            page.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
            notice = page.locator(".kvscope-render-watch .kvscope-render-notice")
            # The first chart (the pools) waits for its plotting library: the dashboard says so ...
            expect(notice).to_contain_text("The pool usage chart did not render in this browser", timeout=120_000)
            expect(notice).to_contain_text("the plotting library did not load")
            # ... and draws it again without a reload, while the first import is still held.
            plot = page.locator(".js-plotly-plot.kvscope-fig-pools").first
            expect(plot.locator(".scatterlayer .trace").first).to_be_visible(timeout=90_000)
            assert plot.evaluate(POINTS_JS) > 0
            assert page.evaluate("window.kvscopeDelayedImports") == 1
            expect(notice).to_contain_text("it is drawn now", timeout=30_000)
            expect(notice).to_contain_text("(nothing drawn after 15 s: the plotting library did not load); rebuilt")
            assert page.locator(".kvscope-fig-pools").count() == 1  # the undrawn one is gone
            expect(page.locator(".kvscope-reload")).to_have_count(0)
            _shot(page, "dashboard-delayed-plotly-recovered.png")
        except Exception:
            _shot(page, "dashboard-delayed-plotly-failure.png")
            print("browser console errors:", errors[:10])
            print("server log tail:", server.log.read_text()[-3000:])
            raise
