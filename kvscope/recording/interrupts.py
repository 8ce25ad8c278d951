"""An interrupt is not a crash: how the way a process stops reaches its recording.

A Ctrl-C (``KeyboardInterrupt``), a SIGTERM (:class:`Terminated`, once :func:`interrupts_recorded`
is in force), ``SystemExit`` and ``GeneratorExit`` stop the engine from outside: its recording ends
``interrupted`` and its outcome is unknown (the engine might have failed a moment later, or never).
None of them is the engine's failure, so no hook records one as ``engine_failed``, which would fire
the failure alarm and lead the analysis with "ENGINE FATAL". Only an engine's own exception (an
``Exception``) is a failure, and a recording that one ends is closed ``error``.

SIGTERM's default action kills the process at once: no ``finally`` block and no exit handler runs,
so the event file loses its end record and reads as cut off. :func:`interrupts_recorded` turns it
into :class:`Terminated`, which unwinds like a Ctrl-C. Standard library only.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_received: list[int] = []
"""The interrupting signals this process received through :func:`interrupts_recorded`'s handlers."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: the process was asked to stop. A ``KeyboardInterrupt``, so every path that stops in
    order on Ctrl-C (the CLI's one line, a follower's flush, a recording's end record) does the same
    on a SIGTERM; the CLI exits ``128 + signum`` (143)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` stops the engine from outside (Ctrl-C, SIGTERM, ``SystemExit``,
    ``GeneratorExit``, a cancellation) rather than being the engine's own failure (an ``Exception``)."""
    return not isinstance(exc, Exception)


def end_status(exc: BaseException | None) -> str:
    """The end record's ``status`` for a recording closed while ``exc`` propagates (None: none):
    ``complete``, ``interrupted`` (:func:`is_interrupt`) or ``error``."""
    if exc is None:
        return "complete"
    return "interrupted" if is_interrupt(exc) else "error"


def received() -> tuple[int, ...]:
    """The interrupting signals (SIGINT, SIGTERM) this process received through the handlers of
    :func:`interrupts_recorded`, in order: a program may catch the ``KeyboardInterrupt`` and exit
    normally, and its recording still ended interrupted (compare the count at its start and end)."""
    return tuple(_received)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise Terminated(signum)


def _chained(previous: Callable[[int, FrameType | None], Any]) -> Callable[[int, FrameType | None], Any]:
    def handler(signum: int, frame: FrameType | None) -> Any:
        _received.append(signum)
        return previous(signum, frame)

    handler.kvscope_chained = previous  # type: ignore[attr-defined]
    return handler


def install() -> dict[int, Any]:
    """Record SIGINT and SIGTERM (:func:`received`) and make SIGTERM unwind as :class:`Terminated`.

    SIGINT keeps Python's action (``KeyboardInterrupt``). SIGTERM at its default action gets
    :class:`Terminated`; a handler the program installed itself is kept and called after the signal
    is recorded; an ignored signal stays ignored. Outside the main thread (where handlers cannot
    be set) nothing changes. Idempotent. Returns the handlers replaced, for :func:`restore`.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    replaced: dict[int, Any] = {}
    for signum, own in ((signal.SIGINT, _on_sigint), (signal.SIGTERM, _on_sigterm)):
        current = signal.getsignal(signum)
        if current in (_on_sigint, _on_sigterm) or hasattr(current, "kvscope_chained"):
            continue  # already recorded
        if current is signal.default_int_handler or (current == signal.SIG_DFL and signum == signal.SIGTERM):
            new: Any = own
        elif callable(current):
            new = _chained(current)
        else:
            continue  # ignored (SIG_IGN), or SIGINT at the OS default: the program chose that
        signal.signal(signum, new)
        replaced[signum] = current
    return replaced


def restore(replaced: dict[int, Any]) -> None:
    """Put back the handlers :func:`install` replaced."""
    for signum, previous in replaced.items():
        signal.signal(signum, previous)


@contextmanager
def interrupts_recorded() -> Iterator[None]:
    """:func:`install` for the duration of the block, then the handlers before it."""
    replaced = install()
    try:
        yield
    finally:
        restore(replaced)


__all__ = ["Terminated", "end_status", "install", "interrupts_recorded", "is_interrupt", "received", "restore"]
