"""The engine-model side of the binding: the CPU model's classes and pool reader (same hooks).

``instrument_replay(path, label=...)`` is what ``kvscope replay --events PATH`` hands to
``kvscope.replay.run(..., instrument=...)``: it instruments the built engine and writes
the replay's event file (see :class:`kvscope.engines.model.session.EventFileSession`).
"""

from __future__ import annotations

from typing import Any


def instrument_replay(path: str, *, label: str = "", **options: Any) -> Any:
    from kvscope.engines.model.session import EventFileSession

    return EventFileSession(path, label=label, **options)
