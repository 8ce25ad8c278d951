"""Event files recorded before kvscope told an interrupt from a crash.

Until then a Ctrl-C, a SIGTERM or ``SystemExit`` leaving an engine call was recorded as the engine's
failure: an ``engine_failed`` row whose reason names the interrupt (``KeyboardInterrupt: ``, request
-1, pool "none"), then a ``request_failed`` row ("engine failed: ...") for every request in flight.
Read as they stand, such a file leads with "ENGINE FATAL ... KeyboardInterrupt" and credits earlier
warnings with a lead time before a failure that never happened. The analysis leaves those rows out
and reads the recording as interrupted: its outcome is unknown.
"""

from __future__ import annotations

import numpy as np

from kvscope.analysis.columns import EventColumns
from kvscope.events import EventKind

INTERRUPT_NAMES = frozenset({"KeyboardInterrupt", "Terminated", "SystemExit", "GeneratorExit", "CancelledError"})
"""Exception types that stop an engine from outside (kvscope.recording.interrupts): never its failure."""

_REQUEST_PREFIX = "engine failed: "
"""How the fatal report worded each request it failed (``Binding.on_fatal``)."""


def recorded_interrupts(ev: EventColumns) -> tuple[np.ndarray, list[str]]:
    """Positions (ascending) of the rows an interrupt left in ``ev`` (its ``engine_failed`` row and
    the ``request_failed`` rows its report added), and the interrupts' type names."""
    fatal = ev.positions(EventKind.ENGINE_FAILED)
    if not len(fatal):
        return np.zeros(0, np.int64), []
    drop: list[int] = []
    names: list[str] = []
    failed = None
    for pos, reason in zip(fatal.tolist(), ev.reason_at(fatal)):
        name, _, message = reason.partition(": ")
        if name not in INTERRUPT_NAMES:
            continue
        drop.append(pos)
        names.append(name)
        if failed is None:
            failed = ev.positions(EventKind.REQUEST_FAILED)
        after = failed[failed > pos]
        if len(after):
            said = _REQUEST_PREFIX + message
            drop.extend(p for p, r in zip(after.tolist(), ev.reason_at(after))
                        if len(r) >= len(_REQUEST_PREFIX) and said.startswith(r))
    return np.unique(np.asarray(drop, dtype=np.int64)), names


def without_recorded_interrupts(ev: EventColumns) -> tuple[EventColumns, str | None]:
    """``ev`` without the rows :func:`recorded_interrupts` finds, and why the run's outcome is then
    unknown (None, and ``ev`` itself, when there are none)."""
    drop, names = recorded_interrupts(ev)
    if not len(drop):
        return ev, None
    keep = np.setdiff1d(np.arange(len(ev), dtype=np.int64), drop, assume_unique=True)
    which = ", ".join(sorted(set(names)))
    return ev.take(keep), (f"the recording was interrupted ({which}, recorded as an engine failure by an "
                           f"earlier kvscope; {len(drop)} row(s) left out)")


__all__ = ["INTERRUPT_NAMES", "recorded_interrupts", "without_recorded_interrupts"]
