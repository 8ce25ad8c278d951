"""What the dashboard's status line and its read-only remediation widgets say: pure functions,
values in, text out (the widget state stays in :mod:`kvscope.ui.dashboard`)."""

from __future__ import annotations

import html

from kvscope.ui.feeds import ERROR, FATAL, INCOMPLETE, SILENT, FeedStatus
from kvscope.ui.live import ReportedRemediation

ALARMING_STATES = (SILENT, INCOMPLETE, FATAL, ERROR)
"""States the status line shows in red: something needs the reader's attention."""
NOT_REPORTED = "not reported"
"""What the mode and policy widgets read when no switch is attached and no event named them."""


def status_html(status: FeedStatus, *, mode_note: str = "", paused_note: str = "", latest_wall: str | None = None) -> str:
    """The status line: the state in bold (red when alarming), the remediation and paused notes, the
    detail, and the latest event's wall-clock time (a real clock's source) unless the state's own
    detail names it (a silent or refused stream)."""
    color = " style='color:#b91c1c'" if status.state in ALARMING_STATES else ""
    latest = f" · latest event {latest_wall}" if latest_wall and status.state not in (SILENT, ERROR) else ""
    return (f"<b{color}>{html.escape(status.state)}</b>{mode_note}{paused_note} — {html.escape(status.detail)}"
            f"{latest}")


def switch_note(in_effect: str, asked: str, *, has_ended: bool, next_run: str | None = None) -> str:
    """The status line's remediation note for a source with a switch: the mode in force, never only
    the one asked for (a change waits for the next scheduling pass; a click after the run ended
    changed nothing in it).

    Args:
        in_effect: the controller's mode (once the run ended: the mode it ended in).
        asked: the mode last asked of the controller.
        has_ended: the run is over (its feed reached a final state).
        next_run: the mode the next run (start replay) starts in, when there is a launcher.
    """
    note = f" · remediation {in_effect}"
    if has_ended:
        if next_run is not None and next_run != in_effect:
            note += f" · next run: {next_run}"
    elif asked != in_effect:
        note += f" (switching to {asked} at the next scheduling pass)"
    return html.escape(note)


def reported_remediation(reported: ReportedRemediation | None) -> tuple[str, str, str]:
    """(mode, policy, tooltip) the read-only widgets show for what the events last reported: never a
    default that may be false."""
    if reported is None:
        return (NOT_REPORTED, NOT_REPORTED, "the events have reported no remediation mode: no remediation "
                "attached, or it was set before this view started")
    enforcing = " (enforcing)" if reported.is_enforcing else ""
    when = ("as the engine's live stream says it is in force (it was set before this view started)"
            if reported.from_header else f"as the engine reported at t={reported.t_s:.2f} s")
    return (reported.mode, reported.policy or NOT_REPORTED, f"{when}{enforcing}; read-only: switch it where it runs")
