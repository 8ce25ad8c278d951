"""Finding texts the batch and streaming analyzers share, so a finding reads the same in the report,
the live view and the exported logs: the bases of a time-to-exhaustion finding, its opening and
its end, an admission gap, a never-fitting request and an engine failure. Pure Python (the streaming analyzer imports it
without pandas or numpy)."""

from __future__ import annotations

import math


def seconds(value: float) -> str:
    """A lead or a span in seconds for a sentence: one decimal, or three below a second (a lead of
    0.037 s is not "0.0 s")."""
    return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3f}"


def debt_text(debt: float, cover: float, window: int) -> str:
    """The ``debt`` basis: certain beyond :func:`~kvscope.analysis.ceiling.debt_cover`, close within it."""
    if debt > cover:
        return f"certain: admitted requests owe {debt:.0f} blocks more"
    return (f"admitted requests owe {debt:.0f} blocks more, within what finishing requests freed in the last "
            f"{window} iterations: close")


def resume_text(past_blocks: float, ceiling: float, freed: float = math.nan, span: float = math.nan) -> str:
    """The ``resume`` basis (a new mirror's first resume refused past the ceiling) in words, with
    what the projection counted as freed while the queue comes in (``freed`` blocks over ``span``
    iterations; NaN: no queue to offset; an infinite span: every block decoding requests hold)."""
    counted = ("" if math.isnan(freed) else
               f", counting {freed:.0f} blocks freed over the {span:.0f} iterations the queue takes to come in,"
               if math.isfinite(span) else f", counting every block decoding requests hold ({freed:.0f}) as freed,")
    return (f"a new mirror's first resume will be refused: admitted and queued requests take it "
            f"{past_blocks:.0f} blocks past the resume ceiling ({ceiling:.0%} of capacity){counted} while the "
            f"target can still admit another request, whose mirror this build creates suspended")


def pass_text(past_blocks: float, ceiling: float, pass_blocks: float, window: int,
              closing_iterations: float = math.inf, rate_window: int = 0) -> str:
    """The ``pass`` basis (one scheduler pass like the largest recent one) in words; with a finite
    ``closing_iterations``, the net growth reaching the ceiling within the rate window as well."""
    closing = ("" if not math.isfinite(closing_iterations) else
               f"; its net growth over the last {rate_window} iterations, its largest pass left out, "
               + (f"reaches the ceiling in about {closing_iterations:.0f} iterations" if closing_iterations >= 0.5
                  else "has brought it to the ceiling"))
    return (f"at risk: one scheduler pass like the largest of the last {window} iterations, when new "
            f"mirrors took {pass_blocks:.0f} blocks at once (each its whole prompt, the target only what it "
            f"does not reuse), would take it {past_blocks:.0f} blocks past the resume ceiling ({ceiling:.0%} "
            f"of capacity), and the next new mirror's first resume would be refused{closing}")


def risk_text(basis: str, *, debt: float, cover: float, rate_window: int, projected: float, admits: bool,
              arrival_max: float, arrival_typical: float, min_debt: float, past: float, ceiling: float,
              pass_blocks: float, burst_window: int, closing_iterations: float = math.inf,
              freed: float = math.nan, span: float = math.nan) -> str:
    """What a time-to-exhaustion basis says at one evaluation point, in words (the batch and
    streaming analyzers share it, so their findings read the same). ``closing_iterations``: the
    ``pass`` basis's net growth reaching the ceiling (:func:`pass_text`); ``freed`` / ``span``:
    the ``resume`` basis's frees (:func:`resume_text`)."""
    if basis == "debt":
        return debt_text(debt, cover, rate_window)
    if basis == "queue":
        return (f"at risk: with the queue admitted it would owe {projected:.0f} blocks"
                + (" and the target has room to admit it now" if admits else ""))
    if basis == "arrival":
        return (f"at risk: one more request like the recent ones would put it {arrival_max:.0f} blocks in debt"
                + (f", a typical one {arrival_typical:.0f}" if arrival_typical > min_debt else "")
                + ", and the target has room to admit it")
    if basis == "resume":
        return resume_text(past, ceiling, freed, span)
    if basis == "pass":
        return pass_text(past, ceiling, pass_blocks, burst_window, closing_iterations, rate_window)
    return "at the current growth"


def tte_summary(pool: str, basis: str, eta_s: float, eta_iterations: float, estimated_at: int,
                utilization: float, available: float, what: str) -> str:
    """The opening sentence of a time-to-exhaustion finding: the estimate where the episode
    started (its first iteration with a consumption rate) and the pool then. ``basis`` is the
    basis where it opened ('trend': net growth; any other: the gross allocation rate)."""
    verb = "reaches its resume ceiling" if basis in ("resume", "pass") else "runs out"
    # Every basis but the trend times the room at the gross allocation rate: a bound for when
    # nothing finishes, not a forecast (a busy pool frees as it allocates), and it says so.
    unless = "" if basis == "trend" else " if nothing frees"
    when = (f"in about {eta_s:.2f} s{unless} ({eta_iterations:.0f} iterations, estimated at iteration {estimated_at})"
            if math.isfinite(eta_s) else "(no consumption rate yet)")
    return f"{pool} pool {verb} {when} at {utilization:.0%} used, {available:.0f} blocks available ({what})."


def critical_from_text(iteration: int, utilization: float, what: str) -> str:
    """The turn of a finding that opened as a warning and turned critical later: where, and why
    (the rule that made it critical, in the pool's state at that iteration), so the reader of a
    critical finding never has to guess from its warning-level opening."""
    return f" Critical from iteration {iteration} at {utilization:.0%} used ({what})."


def episode_end_text(iterations: int, seconds: float, end_iteration: int, peak_utilization: float,
                     utilization: float, available: float, what: str) -> str:
    """The close of a finding whose episode outlived its first estimate: how long it stayed open
    and the pool at its last at-risk iteration, so a long episode does not read as its first hour."""
    return (f" Open {iterations} iterations ({seconds:.1f} s) to iteration {end_iteration}, peak "
            f"{peak_utilization:.0%} used; at its end {utilization:.0%} used, {available:.0f} blocks available "
            f"({what}).")


def gap_text(pool: str, debt: float, need: float, available: float, first_request: int, peak: float,
             capacity: float, critical: bool, rate_window: int, margin_fraction: float) -> str:
    """An admission gap: the debt where it opened, the request admitted into it, its peak, and when
    it never went past what finishing requests freed, that it is close rather than heading for the
    failure."""
    return (f"{pool} pool owes {debt:.0f} blocks: admitted requests still need {need:.0f} "
            f"blocks there but only {available:.0f} are available"
            + (f" (request {first_request} admitted into debt)" if first_request >= 0 else "")
            + f"; peak debt {peak:.0f} blocks of {capacity:.0f}"
            + ("." if critical else f", never more than finishing requests had just freed "
                                    f"({rate_window} iterations) nor {margin_fraction:.0%} "
                                    "of the pool: close, not yet heading for the failure."))


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


__all__ = ["alarm_open_text", "debt_text", "episode_end_text", "gap_text", "pass_text", "resume_text", "risk_text", "seconds", "tte_summary"]
