"""Record a replay of the engine model to an event file: the ``instrument`` callable for
``kvscope.replay.run`` (its documented hook point), and ``instrument_replay(path, label=...)``, what
``kvscope replay --events PATH`` hands to it.

``EventFileSession(path, label=...)`` is called with the built ``EngineParts``: it makes a recorder on
the SIMULATED clock (anchor ``clock="simulated"``, so ``ts_ns / 1e9`` is simulated seconds),
instruments the model (POOL_CONFIGURED for both pools at once), opens the file sink with the header
``meta`` the contract names, and starts a pump. ``close()`` (called by ``run`` after the loop) drains
everything into the file and uninstruments.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from kvscope.engines.binding import Binding
from kvscope.engines.instrumentor import instrument, instrumentor_for, uninstrument
from kvscope.recording import BatchPump, Recorder, Sink, new_run_id, sink_for_path
from kvscope.recording.interrupts import end_status


class EventFileSession:
    """Instrument one replay and write its events to ``path`` (``.jsonl`` or ``.parquet``).

    Args:
        path: event file to write.
        label: scenario name or trace path (header ``meta.scenario``).
        rank: global rank stamped on every event (header ``meta.rank``).
        extra_sinks: more sinks fed by the same pump (e.g. a live publisher).
        capacity: recorder ring size; the pump drains it every ``interval_s`` of wall time.
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, label: str = "", rank: int = 0,
                 extra_sinks: list[Sink] | None = None, capacity: int = 1 << 18,
                 interval_s: float = 0.1) -> None:
        self.path = Path(path) if path is not None else None
        self.label = label
        self.rank = rank
        self.extra_sinks = list(extra_sinks or [])
        self.capacity = capacity
        self.interval_s = interval_s
        self.recorder: Recorder | None = None
        self.binding: Binding | None = None
        self.pump: BatchPump | None = None

    def __call__(self, parts: Any) -> EventFileSession:
        active = instrumentor_for("model")
        if active is not None and active.is_instrumented:
            raise ValueError("the engine model is already instrumented in this process (kvscope-instrument?); "
                             "its events go to that instrumentation's files, so --events cannot be honoured")
        config = parts.config
        clock = parts.clock
        self.recorder = Recorder(capacity=self.capacity, clock=clock.now_ns, rank=self.rank,
                                 clock_name="simulated")
        self.binding = instrument(recorder=self.recorder, engine=parts.executor)
        knobs = config.to_dict() if hasattr(config, "to_dict") else (asdict(config) if is_dataclass(config) else {})
        meta = {
            "engine": "engine_model",
            "engine_version": f"model-of-{knobs.get('engine_version') or 'main-00746ef'}",
            "scenario": self.label,
            "run_id": new_run_id(),
            "seed": knobs.get("seed"),
            "knobs": knobs,
            "pools": dict(self.binding.pool_meta),
            "rank": self.rank,
            "pp_size": knobs.get("pp_size", 1),
            "tp_size": knobs.get("tp_size", 1),
        }
        sinks: list[Sink] = list(self.extra_sinks)
        if self.path is not None:
            sinks.insert(0, sink_for_path(self.path, meta=meta))
        self.pump = BatchPump(self.recorder, sinks, interval_s=self.interval_s)
        return self

    def close(self) -> None:
        """Drain into the file and uninstrument. Called while an exception propagates (the loop
        was interrupted or failed), the file's end record says so (:func:`end_status`: a Ctrl-C,
        SIGTERM or ``SystemExit`` is ``interrupted``, the engine's own exception ``error``)."""
        status = end_status(sys.exc_info()[1])
        try:
            if self.pump is not None:
                self.pump.shutdown(status=status)
        finally:
            uninstrument("model")

    @property
    def dropped(self) -> int:
        return self.recorder.dropped if self.recorder is not None else 0


def instrument_replay(path: str, *, label: str = "", **options: Any) -> EventFileSession:
    """The ``instrument=`` callable that records one replay to ``path`` (see :class:`EventFileSession`)."""
    return EventFileSession(path, label=label, **options)
