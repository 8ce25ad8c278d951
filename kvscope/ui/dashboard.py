"""The live dashboard: ipywidgets controls around plotly ``FigureWidget``s, fed by a :class:`Feed`.

Three layers, as in jupyter-scatter: the pure figure builders (:mod:`kvscope.ui.pools`, ``debt``,
``requests``, ``reuse``) make a ``go.Figure`` from the :class:`~kvscope.ui.live.LiveView` frames;
this module only holds widget state and copies each new figure into its ``FigureWidget`` inside
one ``batch_update()`` (one message per figure and refresh, no flicker); composition (which engine,
which remediation controller) is done by the caller, :mod:`kvscope.attach`. The front end imports no
engine: remediation arrives as a :class:`RemediationSwitch`, replays as a :class:`Launcher`.

Refreshing runs as a task on the kernel's own event loop (:meth:`Dashboard.start`), so widget state
is only ever touched from the thread that also handles the browser's clicks. Pausing stops drawing
but not reading: the view stays bounded and findings keep arriving while paused.

Every widget carries a ``kvscope-*`` CSS class (``add_class``) so tests and custom CSS find it.

Size: one widget class over 400 lines: its remediation switch follows the run's end (a toggle that
reaches the live controller, is relabelled for the next run, or is disabled), and its handlers share
the widget state the refresh task touches on the kernel's thread, so they stay in the class; the
figures and the feeds live in their own modules.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

from kvscope.analysis.analyzer import wall_clock_at
from kvscope.ui import debt as debt_fig
from kvscope.ui import pools as pools_fig
from kvscope.ui import requests as requests_fig
from kvscope.ui import reuse as reuse_fig
from kvscope.ui.beacon import ShownBeacon
from kvscope.ui.clock_axes import label_wall_clock
from kvscope.ui.controls import Launcher, RemediationSwitch
from kvscope.ui.feeds import (
    ERROR,
    FATAL,
    FINISHED,
    IDLE,
    INCOMPLETE,
    PAUSED_NOTE,
    RUNNING,
    SILENT,
    Feed,
    FeedStatus,
)
from kvscope.ui.figure_sync import sync_figure
from kvscope.ui.findings_table import findings_html
from kvscope.ui.live import LiveView, ReportedRemediation
from kvscope.ui.render_watch import RenderWatch
from kvscope.ui.status_line import reported_remediation, status_html, switch_note

FINAL_STATES = (FINISHED, INCOMPLETE, FATAL, "stopped", ERROR)
FIGURES = (("fig_pools", "pool usage"), ("fig_debt", "draft debt"), ("fig_requests", "requests"),
           ("fig_reuse", "prefix reuse"))
FULL_STATE_EVERY = 10
"""Every n-th refresh also stores the full figures for views created later (see sync_figure)."""
MAX_FIGURE_REBUILDS = 2
"""Times a chart the browser did not draw is rebuilt before the dashboard asks for a reload."""
MODE_BUTTON_WIDTH_PX = 72
"""Width of each remediation switch button: the four fit on one row beside policy and pause."""
_UNSHOWN = object()  # the reported remediation widgets show nothing yet


class Dashboard:
    """Pools, debt, requests and reuse of a running (or recorded) engine, with the remediation switch.

    Args:
        feed: the event source (attach one later with :meth:`attach`).
        switch: the remediation control of that source, if it has one.
        launcher: offers a scenario picker, knob fields and a Start button.
        refresh_s: seconds between refreshes when started.
        view_factory: makes the bounded state for each attached feed.
        max_requests_shown: rows of the request timeline.
    """

    def __init__(self, feed: Feed | None = None, *, switch: RemediationSwitch | None = None,
                 launcher: Launcher | None = None, refresh_s: float = 0.5,
                 view_factory: Callable[[], LiveView] = LiveView, max_requests_shown: int = 120,
                 title: str = "kvscope live") -> None:
        self.refresh_s = refresh_s
        self.view_factory = view_factory
        self.max_requests_shown = max_requests_shown
        self.launcher = launcher
        self.feed: Feed | None = None
        self.switch: RemediationSwitch | None = None
        self.view = view_factory()
        self.num_refreshes = 0
        self.last_refresh_ms = 0.0
        self.error: str | None = None
        self._task: asyncio.Task | None = None
        self._last_polled = 0
        self._syncing = False
        self._start_when_shown = False
        self._findings_shown: tuple | None = None  # what the findings table shows (see redraw)
        self._state = IDLE
        self._has_ended = False  # the attached feed reached a final state: the switch acts on nothing
        self._status = FeedStatus(IDLE, "no source attached")
        # What the user picked on the switch: the next start_replay starts in it (None: never picked).
        self._chosen_mode: str | None = None
        self._chosen_policy: str | None = None
        self._shown_reported: ReportedRemediation | None | object = _UNSHOWN
        self._build(title)
        if feed is not None:
            self.attach(feed, switch)

    # ------------------------------------------------------------------ widgets
    def _build(self, title: str) -> None:
        self.title = w.HTML(f"<b>{html.escape(title)}</b>")
        self.status = _cls(w.HTML("idle"), "kvscope-status", "kvscope-state-idle")
        # Narrow buttons: at ipywidgets' default width (148 px) "auto" wraps to a second row in a
        # JupyterLab panel, where it reads as a separate control.
        self.mode = _cls(w.ToggleButtons(options=["off"], value="off", description="remediation",
                                         disabled=True, tooltips=["no remediation control attached"],
                                         style={"button_width": f"{MODE_BUTTON_WIDTH_PX}px"}),
                         "kvscope-remediation")
        self.policy = _cls(w.Dropdown(options=["(none)"], description="policy", disabled=True), "kvscope-policy")
        self.pause = _cls(w.ToggleButton(value=False, description="pause view", icon="pause"), "kvscope-pause")
        self.counters = _cls(w.HTML(""), "kvscope-counters")
        self.findings = _cls(w.HTML(findings_html([])), "kvscope-findings")
        # The figures are created one per refresh, not with the page: each FigureWidget's model loads
        # plotly's whole bundle in the browser, which anywidget allows 2 s; four at once on a busy
        # machine miss that and stay blank.
        self.fig_pools = self.fig_debt = self.fig_requests = self.fig_reuse = None
        self._slots = {name: _cls(w.HTML(f"<i>{label}: loading</i>"), "kvscope-figure-slot")
                       for name, label in FIGURES}
        self.mode.observe(self._on_mode, names="value")
        self.policy.observe(self._on_policy, names="value")
        self.pause.observe(self._on_pause, names="value")
        controls = [self.mode, self.policy, self.pause]
        picker: list[w.Widget] = []
        if self.launcher is not None:
            sources = self.launcher.sources()
            self.source = _cls(w.Dropdown(options=sources, value=sources[0], description="scenario",
                                          layout=w.Layout(width="420px")),
                               "kvscope-source")
            self.knob_box = _cls(w.HBox([], layout=w.Layout(flex_flow="row wrap")), "kvscope-knobs")
            self.start_button = _cls(w.Button(description="start replay", icon="play", button_style="primary"),
                                     "kvscope-start")
            self.source.observe(lambda _c: self._fill_knobs(), names="value")
            self.start_button.on_click(lambda _b: self._on_start_clicked())
            self._fill_knobs()
            picker = [w.HBox([self.source, self.start_button]), self.knob_box]
        self.beacon = _cls(ShownBeacon(), "kvscope-beacon")
        self.render_watch = _cls(RenderWatch(on_failed=self._on_figure_failed, on_drawn=self._on_figure_drawn),
                                 "kvscope-render-watch")
        self._figure_rebuilds: dict[str, int] = {}
        self._figure_failures: dict[str, str] = {}  # chart -> why the browser did not draw it
        self.beacon.observe(self._on_shown, names="shown")
        self.widget = _cls(w.VBox([
            self.title, self.beacon, self.render_watch, *picker, w.HBox(controls), self.status, self.counters,
            self._slots["fig_pools"], self.findings, self._slots["fig_debt"], self._slots["fig_requests"],
            self._slots["fig_reuse"],
        ]), "kvscope-dashboard")

    def _fill_knobs(self) -> None:
        assert self.launcher is not None
        fields = []
        for name, value in self.launcher.knobs(self.source.value).items():
            fields.append(_cls(w.Text(value=str(value), description=name, style={"description_width": "initial"},
                                      layout=w.Layout(width="220px")), f"kvscope-knob-{name}"))
        self.knob_box.children = fields

    def _on_start_clicked(self) -> None:
        self._start_when_shown = False
        self.start_replay()

    def knob_values(self) -> dict[str, str]:
        return {f.description: f.value for f in getattr(self, "knob_box", w.HBox()).children}

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    # ------------------------------------------------------------------ sources
    def attach(self, feed: Feed, switch: RemediationSwitch | None = None) -> None:
        """Show ``feed`` from now on (a fresh view; the previous feed is closed)."""
        if self.feed is not None and self.feed is not feed:
            self.feed.close()
        self.feed, self.switch = feed, switch
        self.view = self.view_factory()
        self._findings_shown = None
        self.error = None
        self._has_ended = False
        self._attach_switch(switch)
        self.refresh(force=True)

    def start_replay(self, *, when: str = "now") -> None:
        """Start the picked scenario with the knob fields (the launcher's ``start``) and watch it.

        Args:
            when: ``"now"``, or ``"shown"``: as soon as a browser has rendered the dashboard (Voila
                paints the page only after the notebook ran; a headless run never starts it).
        """
        if self.launcher is None:
            raise ValueError("this dashboard has no launcher (pass launcher=...)")
        if when == "shown" and not self.beacon.shown:
            self._start_when_shown = True
            self._show_status(FeedStatus(IDLE, f"{self.source.value} starts when the dashboard is shown "
                                               "(or press start replay)"))
            return
        try:
            feed, switch = self.launcher.start(self.source.value, self.knob_values(),
                                               remediation=self._chosen_mode, policy=self._chosen_policy)
        except Exception as exc:  # noqa: BLE001 - a bad knob value is shown, not raised into the event loop
            self._show_status(FeedStatus(ERROR, f"{type(exc).__name__}: {exc}"))
            return
        self.attach(feed, switch)
        self.start()

    def _on_shown(self, change: dict) -> None:
        if change["new"] and self._start_when_shown:
            self._start_when_shown = False
            self.start_replay()

    def _attach_switch(self, switch: RemediationSwitch | None) -> None:
        self._syncing = True
        try:
            if switch is None:
                self._shown_reported = _UNSHOWN
                self._show_reported(self.view.remediation)
                return
            self.mode.options = list(switch.modes)
            self.mode.tooltips = [f"remediation {m}" for m in switch.modes]
            self.mode.value = switch.mode
            self.mode.disabled = False
            self.mode.description = "remediation"
            self.policy.options = list(switch.policies) or ["(none)"]
            self.policy.value = switch.policy if switch.policy in switch.policies else self.policy.options[0]
            self.policy.disabled = not switch.policies
        finally:
            self._syncing = False

    def _show_reported(self, reported: ReportedRemediation | None) -> None:
        """Without a switch (another process's stream, a file), the mode and policy widgets show,
        read-only, what the events last reported: never a default that may be false."""
        if reported == self._shown_reported:
            return
        self._shown_reported = reported
        self._syncing = True
        try:
            mode, policy, tip = reported_remediation(reported)
            self.mode.options, self.mode.value, self.mode.disabled = [mode], mode, True
            self.mode.tooltips = [tip]
            self.policy.options, self.policy.value, self.policy.disabled = [policy], policy, True
        finally:
            self._syncing = False

    def _show_ended(self) -> None:
        """The run is over: the switch can change nothing in it. With a launcher it picks the next
        run's mode and says so; without one it is disabled."""
        if self.switch is None:
            return
        modes = list(self.switch.modes)
        self._syncing = True
        try:
            if self.launcher is not None:
                self.mode.description = "next run"
                self.mode.tooltips = [f"this run has ended: start replay starts the next one with remediation {m}"
                                      for m in modes]
            else:
                self.mode.disabled = self.policy.disabled = True
                self.mode.tooltips = ["this run has ended: the switch has nothing left to act on"] * len(modes)
        finally:
            self._syncing = False

    def _on_mode(self, change: dict) -> None:
        if self.switch is None or self._syncing:
            return
        self._chosen_mode = change["new"]
        if not self._has_ended and change["new"] != self.switch.mode:
            self.switch.set_mode(change["new"])
            self.refresh(force=True)
        else:
            self._show_status(self._status)  # the next run's mode

    def _on_policy(self, change: dict) -> None:
        if self.switch is not None and not self._syncing and change["new"] in self.switch.policies:
            self._chosen_policy = change["new"]
            if not self._has_ended:
                self.switch.set_policy(change["new"])

    def _on_pause(self, change: dict) -> None:
        self.pause.description = "resume view" if change["new"] else "pause view"
        self.pause.icon = "play" if change["new"] else "pause"
        if not change["new"]:
            self.refresh(force=True)

    # ------------------------------------------------------------------ refresh
    def refresh(self, *, force: bool = False) -> FeedStatus:
        """Read what the feed has, update the view and (unless paused) redraw. Returns the status."""
        status = FeedStatus(IDLE, "no source attached")
        if self.feed is not None:
            try:
                events = self.feed.poll()
                self._last_polled = len(events)
                if events:
                    self.view.feed(events)
                # A live stream's header says the remediation state in force: a view that joined
                # after the change's event shows it too.
                self.view.note_stream_remediation(getattr(self.feed, "reported_remediation", None))
                status = self.feed.status()
            except Exception as exc:  # noqa: BLE001 - shown in the status line; the loop keeps going
                self.error = f"{type(exc).__name__}: {exc}"
                status = FeedStatus(ERROR, self.error)
        if self.view.fatal is not None and status.state in (FINISHED, INCOMPLETE, RUNNING, SILENT):
            status = FeedStatus(FATAL, self.view.fatal.message)
        if self.switch is None:
            self._show_reported(self.view.remediation)
        final = status.state in FINAL_STATES
        if final and self.feed is not None and not self._has_ended:
            self._has_ended = True
            self._show_ended()
        if not self.pause.value or force:
            t0 = time.perf_counter()
            try:
                self.redraw(full_state=final or self.num_refreshes % FULL_STATE_EVERY == 0)
            except Exception as exc:  # noqa: BLE001 - shown in the status line, not lost in the event loop
                self.error = f"{type(exc).__name__} while drawing: {exc}"
                status = FeedStatus(ERROR, self.error)
            self.last_refresh_ms = (time.perf_counter() - t0) * 1e3
        self._show_status(status)
        self.num_refreshes += 1
        return status

    def redraw(self, *, full_state: bool = False) -> None:
        """Rebuild the figures from the view and send them (``full_state``: see :func:`sync_figure`)."""
        v = self.view
        findings = v.findings_frame()
        fatal = (v.fatal.t_s, v.fatal.label) if v.fatal is not None else None
        built = {
            "fig_pools": lambda: pools_fig.pool_panels_figure(v.pools_frame(), findings, fatal=fatal,
                                                              switches=list(v.mode_changes)),
            "fig_debt": lambda: debt_fig.debt_projection_figure(v.exhaustion_frame(), findings, fatal=fatal),
            "fig_requests": lambda: requests_fig.request_events_figure(
                v.timeline_frame(), now_s=v.t_s, max_requests=self.max_requests_shown),
            "fig_reuse": lambda: reuse_fig.reuse_hit_rate_figure(v.reuse_frame(), now_s=v.t_s),
        }
        offset_ns = self.wall_clock_offset_ns
        wall = wall_clock_at(offset_ns) if offset_ns is not None else None
        created = False
        for name, _label in FIGURES:
            widget = getattr(self, name)
            if widget is None:
                if created:
                    continue  # one new figure per refresh
                widget = _cls(go.FigureWidget(), f"kvscope-{name.replace('_', '-')}")
                setattr(self, name, widget)
                self.widget.children = tuple(widget if c is self._slots[name] else c for c in self.widget.children)
                created = True
            fig = built[name]()
            if offset_ns is not None:
                label_wall_clock(fig, offset_ns)
            sync_figure(widget, fig, full_state=full_state)
        expected = {name.replace("_", "-"): [fw.model_id, len(fw.data)] for name, _label in FIGURES
                    if (fw := getattr(self, name)) is not None}
        if expected != self.render_watch.expected:
            self.render_watch.expected = expected
        # Findings change in place as well as arrive: an episode extends, escalates to critical and
        # rewrites its closing words. Redraw the table when any of that moved, not only the count.
        current = v.analyzer.findings
        off = getattr(self.feed, "analysis_off", None)
        shown = (offset_ns, off, *((f.kind, f.severity, f.iteration_start, f.iteration_end, f.summary) for f in current))
        if shown != self._findings_shown:
            self.findings.value = findings_html(current, wall, analysis_off=off)
            self._findings_shown = shown
        c = v.counts
        reserved = ", ".join(f"{p} {n:,}" for p, n in v.reserved_blocks().items())
        self.counters.value = (
            f"<span class='kvscope-count-events'>{c['events']:,} events</span> · iteration {v.iteration} · "
            f"t={v.t_s:.2f} s{f' ({wall(v.t_s)})' if wall is not None else ''} · {v.num_running} in flight · "
            f"<span class='kvscope-count-deferrals'>deferrals {c['deferrals']:,}</span> · "
            f"<span class='kvscope-count-reservations'>reservations {c['reservations']:,}</span> · "
            f"<span class='kvscope-count-reserved'>reserved blocks: {reserved or 'none'}</span> · "
            f"finished {c['finished']:,} · failed {c['failed']:,} · rejected {c['rejected']:,} · "
            f"contained {c['contained']:,} · "
            f"<span class='kvscope-count-shadowed'>shadow would act {c['shadowed']:,}</span>")

    def _on_figure_failed(self, css_name: str, model_id: str, reason: str) -> None:
        """The browser did not draw a chart (see :class:`RenderWatch`): a new ``FigureWidget`` in
        its place makes the browser load and draw it afresh, up to ``MAX_FIGURE_REBUILDS`` times."""
        name = css_name.replace("-", "_")
        old = getattr(self, name, None) if name in dict(FIGURES) else None
        if old is None or old.model_id != model_id:
            return  # already replaced
        label = dict(FIGURES)[name]
        tries = self._figure_rebuilds.get(name, 0)
        if tries >= MAX_FIGURE_REBUILDS:
            self.render_watch.notice = (f"The {label} chart did not render in this browser ({reason}), "
                                        f"also after {tries} rebuilds: reload the page.")
            self.render_watch.needs_reload = True
            return
        self._figure_rebuilds[name] = tries + 1
        self._figure_failures[name] = reason
        self.render_watch.notice = (f"The {label} chart did not render in this browser ({reason}); "
                                    f"rebuilt it (try {tries + 1} of {MAX_FIGURE_REBUILDS}).")
        fresh = _cls(go.FigureWidget(), f"kvscope-{css_name}")
        setattr(self, name, fresh)
        self.widget.children = tuple(fresh if c is old else c for c in self.widget.children)
        old.close()
        self.redraw(full_state=True)

    def _on_figure_drawn(self, css_name: str) -> None:
        name = css_name.replace("-", "_")
        label = dict(FIGURES).get(name, css_name)
        if not self.render_watch.needs_reload:
            self.render_watch.notice = (f"The {label} chart did not render in this browser "
                                        f"({self._figure_failures.get(name, 'reason unknown')}); rebuilt, it is "
                                        "drawn now.")

    def _show_status(self, status: FeedStatus) -> None:
        """The status line: state in bold, remediation mode, paused note, one line of detail; the
        state is also a CSS class (``kvscope-state-running`` ...) for tests and styling."""
        state = status.state
        self._status = status
        paused = PAUSED_NOTE if self.pause.value else ""
        reported = self.view.remediation
        sw = self.switch
        if sw is not None:
            mode = switch_note(sw.mode_in_effect, sw.mode, has_ended=self._has_ended,
                               next_run=self.mode.value if self.launcher is not None else None)
        else:
            mode = f" · remediation {reported.mode} (as reported)" if reported is not None else ""
        offset_ns = self.wall_clock_offset_ns
        latest = wall_clock_at(offset_ns)(self.view.t_s) if offset_ns is not None and self.view.counts["events"] else None
        self.status.value = status_html(status, mode_note=mode, paused_note=paused, latest_wall=latest)
        if state != self._state:
            self.status.remove_class(f"kvscope-state-{self._state.replace(' ', '-')}")
            self.status.add_class(f"kvscope-state-{state.replace(' ', '-')}")
            self._state = state

    @property
    def wall_clock_offset_ns(self) -> int | None:
        """The feed's event-clock to epoch offset when it runs on a real clock (``Feed`` may have a
        ``wall_clock_offset_ns``), else None: a simulated clock's seconds are the run's own."""
        return getattr(self.feed, "wall_clock_offset_ns", None) if self.feed is not None else None

    @property
    def state(self) -> str:
        return self._state

    # ------------------------------------------------------------------ steady refresh
    def start(self, refresh_s: float | None = None) -> bool:
        """Refresh every ``refresh_s`` on the running event loop (the kernel's) until the feed ends.

        Returns False outside a running loop (a plain script): there, :meth:`wait` refreshes.
        """
        if refresh_s is not None:
            self.refresh_s = refresh_s
        self.stop()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._task = loop.create_task(self._loop())
        return True

    def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

    async def _loop(self) -> None:
        while True:
            status = self.refresh()
            if status.state in FINAL_STATES and not self._last_polled:
                return  # the source ended and everything it sent is drawn
            await asyncio.sleep(self.refresh_s)

    def wait(self, timeout_s: float = 600.0) -> FeedStatus:
        """Refresh in a blocking loop until the feed ends (scripts and headless runs)."""
        deadline = time.monotonic() + timeout_s
        status = self.refresh()
        while (status.state not in FINAL_STATES or self._last_polled) and time.monotonic() < deadline:
            time.sleep(self.refresh_s)
            status = self.refresh()
        return self.refresh(force=True)


def _cls(widget: Any, *classes: str) -> Any:
    for c in classes:
        widget.add_class(c)
    return widget
