"""Replay a scenario or a trace on the engine model and summarise it: ``run(...) -> ReplaySummary``.

The composition layer: an engine from ``kvscope.engine_model.build`` and traffic from
``kvscope.workloads``, paired by the scenario registry (``scenarios.py``). Neither side imports the
other.

Hook point for instrumentation: ``run(..., instrument=callable)`` calls ``instrument(engine)`` with
the built ``EngineParts`` (executor, scheduler, resource manager, managers, workload, config) BEFORE
the loop starts; whatever it returns is kept, and if it has a ``close()`` method that is called after
the loop (flush an event file, uninstrument). The model itself emits nothing.

Deterministic per seed: the workload is seeded from ``config.seed``, the executor's MTP acceptance
phases too, and nothing reads the wall clock except ``wall_seconds`` and pacing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kvscope.engine_model.build import EngineParts, build_engine
from kvscope.engine_model.config import EngineConfig
from kvscope.engine_model.executor import PyExecutorModel
from kvscope.workloads.cancellations import with_cancellations
from kvscope.workloads.workload import TraceFormatError

from .scenarios import SCENARIOS, get_scenario, trace_workload_builder

__all__ = ["EngineParts", "ReplaySummary", "build_engine", "resolve", "run", "summarize"]


@dataclass(slots=True)
class ReplaySummary:
    """What ``kvscope replay --json`` prints. Keys are a public contract: add, never rename.

    Definitions: ``requests_total`` arrivals seen (rejected included); ``requests_failed`` requests
    in the engine when it died (each gets the error); ``sim_seconds`` simulated time at the end;
    ``peak_utilization`` per pool, the highest (capacity - free - evictable) / capacity right after
    any iteration's ``prepare_resources`` or at the engine failure (the POOL_SNAPSHOT points, so it
    is the maximum of the snapshot rows' utilisation and of the exported pool utilisation gauge); ``prefix_hit_rate`` prompt tokens reused
    at admission / prompt tokens admitted; ``goodput_tokens_per_s`` output tokens of completed
    requests per simulated second; ``mean_running_requests`` time-weighted mean batch size (with pipeline parallelism, the requests of
    every micro-batch in flight);
    ``queue_wait_*`` arrival to first scheduled chunk (nearest-rank percentiles, s);
    ``requests_errored`` requests ended one by one with an error response while the engine served on
    (the executor's per-request error path, ``PyExecutorModel._handle_errors(..., requests=[...])``);
    ``requests_cancelled`` requests the client cancelled (``cancel_rate``), ended without an error.
    ``engine_fatal`` covers a crash of the loop and an error the executor classified fatal;
    ``engine_stalled`` a loop that would spin without end, scheduling nothing while requests wait
    (``stall_message`` says why; the model stops it, see ``executor.STALL_LIMIT_S``);
    ``requests_unfinished`` requests still active when the run ended (a stall, ``max_sim_seconds``).
    """

    source: str
    requests_total: int
    requests_completed: int
    requests_failed: int
    requests_rejected: int
    engine_fatal: bool
    fatal_message: str | None
    fatal_request_id: int | None
    sim_seconds: float
    wall_seconds: float
    peak_utilization: dict[str, float]
    prefix_hit_rate: float
    goodput_tokens_per_s: float
    mean_running_requests: float
    queue_wait_p50_s: float
    queue_wait_p99_s: float
    rejection_reasons: dict[str, int] = field(default_factory=dict)
    fatal_error_type: str | None = None
    fatal_ranks: list[int] = field(default_factory=list)
    killed_ranks: list[int] = field(default_factory=list)
    healthy: bool = True
    iterations: int = 0
    iterations_fast_forwarded: int = 0
    pool_capacity_blocks: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    requests_errored: int = 0
    requests_cancelled: int = 0
    engine_stalled: bool = False
    stall_message: str | None = None
    requests_unfinished: int = 0
    engine_version: str = ""
    """The TensorRT-LLM build the model followed (the ``engine_version`` knob, aliases resolved:
    ``1.3.0rc25``); also under ``config``, here at the top so a reader of any output sees it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve(source: str) -> tuple[EngineConfig, Callable[[EngineConfig], Any], str]:
    """(base config, workload builder, label) for a scenario name or a trace path.

    A trace replays on the ``glm5-dsa`` engine (override knobs with ``--set``).

    Raises:
        ValueError: neither a built-in scenario nor a trace file name (the message lists scenarios).
        FileNotFoundError: a trace path that does not exist.
    """
    if source in SCENARIOS:
        scenario = get_scenario(source)
        return scenario.config, scenario.build_workload, scenario.name
    if source.endswith((".jsonl", ".tar.xz", ".tar")) or os.path.isfile(source):
        # An existing file of another kind gets the trace reader's "unknown trace format" error.
        return SCENARIOS["glm5-dsa"].config, trace_workload_builder(source), str(source)
    get_scenario(source)  # raises ValueError naming the built-in scenarios
    raise AssertionError("unreachable")  # pragma: no cover


def run(source: str, overrides: list[str] | dict[str, Any] | None = None, *,
        config: EngineConfig | None = None, workload: Any = None,
        instrument: Callable[[EngineParts], Any] | None = None,
        progress: Callable[[PyExecutorModel], None] | None = None) -> ReplaySummary:
    """Replay ``source`` (scenario name or trace path) with ``overrides`` applied.

    Args:
        source: a built-in scenario name or a trace path (``--trace``).
        overrides: ``["key=value", ...]`` or a dict, applied to the scenario's config.
        config: use this config instead of the scenario's (overrides still apply).
        workload: use this workload instead of building the scenario's (tests, shortened runs).
        instrument: called with the built ``EngineParts`` before the loop (see module docstring).
        progress: called every ~0.5 s of wall time with the executor (terminal progress line).
    """
    base, build_workload, label = resolve(source)
    config = (config or base).with_overrides(overrides or [])
    parts = build_engine(config)
    parts.workload = with_cancellations(workload if workload is not None else build_workload(config),
                                        cancel_rate=config.cancel_rate, cancel_after_s=config.cancel_after_s,
                                        seed=config.seed)
    handle = instrument(parts) if instrument is not None else None
    wall_start = time.perf_counter()
    try:
        parts.executor.run(parts.workload, max_sim_seconds=config.max_sim_seconds, progress=progress)
        error = parts.executor.event_loop_error
        if isinstance(error, TraceFormatError):
            # The workload is read lazily inside the loop, so a bad row surfaces there; it is the
            # input's fault, not the engine's, and is reported as such (never engine_fatal).
            raise error
    finally:
        if handle is not None and hasattr(handle, "close"):
            handle.close()
    return summarize(parts, label, time.perf_counter() - wall_start)


def summarize(parts: EngineParts, label: str, wall_seconds: float) -> ReplaySummary:
    executor = parts.executor
    stats = executor.stats
    sim_seconds = executor.clock.now_s
    waits = sorted(stats.queue_waits_s)
    error = executor.event_loop_error or executor.fatal_error
    capacities = {name: probe().capacity_blocks for name, probe in executor.pool_probes.items()}
    return ReplaySummary(
        source=label,
        requests_total=stats.requests_total,
        requests_completed=stats.requests_completed,
        requests_failed=stats.requests_failed,
        requests_rejected=stats.requests_rejected,
        engine_fatal=error is not None,
        fatal_message=str(error) if error is not None else None,
        fatal_request_id=executor.fatal_request_id,
        sim_seconds=round(sim_seconds, 6),
        wall_seconds=round(wall_seconds, 6),
        peak_utilization={name: round(stats.peak_used_fraction.get(name, 0.0), 6) for name in capacities},
        prefix_hit_rate=round(stats.reused_tokens_admitted / stats.prompt_tokens_admitted, 6)
        if stats.prompt_tokens_admitted else 0.0,
        goodput_tokens_per_s=round(stats.output_tokens_completed / sim_seconds, 6) if sim_seconds > 0 else 0.0,
        mean_running_requests=round(stats.running_request_seconds / sim_seconds, 6) if sim_seconds > 0 else 0.0,
        queue_wait_p50_s=round(_percentile(waits, 0.50), 6),
        queue_wait_p99_s=round(_percentile(waits, 0.99), 6),
        rejection_reasons=dict(stats.rejection_reasons),
        fatal_error_type=type(error).__name__ if error is not None else None,
        fatal_ranks=list(executor.fatal_ranks),
        killed_ranks=list(executor.killed_ranks),
        healthy=executor.is_healthy,
        iterations=executor.iter_counter,
        iterations_fast_forwarded=stats.num_iterations_fast_forwarded,
        pool_capacity_blocks=capacities,
        config=parts.config.to_dict(),
        requests_errored=stats.requests_errored,
        requests_cancelled=stats.requests_cancelled,
        engine_stalled=executor.stall_message is not None,
        stall_message=executor.stall_message,
        requests_unfinished=len(executor.active_requests),
        engine_version=str(getattr(parts.config, "engine_version", "") or ""),
    )


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, int(-(-q * len(sorted_values) // 1)))
    return sorted_values[min(rank, len(sorted_values)) - 1]
