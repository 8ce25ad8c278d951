"""Texts several rules and reports share: a span in seconds and the alarm open on a pool at a
failure. Each finding kind's own wording lives in its rule module (:mod:`kvscope.analysis.rules`),
which the batch and streaming analyzers both call, so a finding reads the same in the report, the
live view and the exported logs. Pure Python."""

from __future__ import annotations


def seconds(value: float) -> str:
    """A lead or a span in seconds for a sentence: one decimal, or three below a second (a lead of
    0.037 s is not "0.0 s")."""
    return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3f}"


def alarm_open_text(alarm: dict, word: str, with_seconds: bool) -> str:
    """The alarm open on a pool at a failure (:func:`~kvscope.analysis.incidents.open_alarm`):
    ``time_to_exhaustion critical open from 42 iterations <word>``. An episode that opened as a
    warning and turned critical later says both, so a critical 3 iterations ahead never reads as
    one 280 ahead."""
    def span(iterations: int, secs: float | None) -> str:
        return f"{iterations} iterations" + (f" ({seconds(secs)} s)" if with_seconds and secs is not None else "")

    crit = alarm.get("critical_lead_iterations")
    if crit is not None and crit < alarm["lead_iterations"]:
        return (f"{alarm['kind']} warning open from {span(alarm['lead_iterations'], alarm['lead_s'])} {word}, "
                f"critical from {span(crit, alarm.get('critical_lead_s'))} {word}")
    return f"{alarm['kind']} {alarm['severity']} open from {span(alarm['lead_iterations'], alarm['lead_s'])} {word}"


__all__ = ["alarm_open_text", "seconds"]
