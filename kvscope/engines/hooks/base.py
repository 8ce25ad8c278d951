"""What every hook shares: the factory signature and the "record the fatal raise, then re-raise" step.

Only the engine's own exception (an ``Exception``) is a failure. A Ctrl-C, a SIGTERM, ``SystemExit``
or ``GeneratorExit`` leaving an engine call stops the engine from outside: nothing is recorded for
it, and the recording ends ``interrupted`` (:mod:`kvscope.recording.interrupts`), its outcome unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.engines.binding import Binding
from kvscope.events import PoolRole

Method = Callable[..., Any]
HookFactory = Callable[[Binding, Method], Method]
"""``factory(binding, original) -> method``: ``method`` replaces ``original`` on its class."""


def report_fatal(b: Binding, exc: Exception, raising_pool: PoolRole | None = None) -> None:
    """Record an exception leaving the engine's loop (:meth:`Binding.on_fatal`: ENGINE_FAILED once
    per exception, the pools, every pending request failed) before the caller re-raises it.
    Callers catch ``Exception`` only: an interrupt passes through unrecorded.

    ``raising_pool`` names the pool whose manager raised, when the caller knows it. Never raises: a
    failure of the recording is counted, and the caller's bare ``raise`` passes the engine's
    exception on unchanged.
    """
    try:
        if raising_pool is not None:
            b.raising_pool = raising_pool
        b.on_fatal(exc)
    except Exception:
        b.hook_failed()
