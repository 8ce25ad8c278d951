"""Replays: an engine model composed with a workload, run and summarised.

``run(source, overrides)`` replays a built-in scenario or a trace; ``build_engine`` / ``resolve`` /
``summarize`` are its pieces for callers that drive the loop themselves (benchmarks, tests).
"""

from kvscope.engine_model.build import EngineParts, build_engine

from .runner import ReplaySummary, resolve, run, summarize
from .scenarios import SCENARIOS, Scenario, get_scenario, trace_workload_builder

__all__ = [
    "SCENARIOS", "EngineParts", "ReplaySummary", "Scenario", "build_engine", "get_scenario", "resolve",
    "run", "summarize", "trace_workload_builder",
]
