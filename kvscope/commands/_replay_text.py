"""``kvscope replay``'s readable summary: the verdict line naming the engine build, then one row per
summary key, numbers rounded for reading (``--json`` keeps the values themselves)."""

from __future__ import annotations

from typing import Any


def build_label(version: str) -> str:
    """``1.3.0rc25 (v1.3.0rc25 785c948)``: an ``engine_version`` and the release or commit it is."""
    from kvscope.engine_model.versions import get_engine_build

    return get_engine_build(version).label if version else "unknown build"


def value_text(key: str, value: Any) -> str:
    """A summary value as text (``--json`` has the values themselves): shares as percentages, other
    fractional numbers rounded, mappings as ``name value`` pairs, nothing as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        if not value:
            return "-"
        if key == "peak_utilization":
            return ", ".join(f"{k} {v:.1%}" for k, v in value.items())
        return ", ".join(f"{k}: {value_text(k, v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.1%}" if key == "prefix_hit_rate" else _rounded(value)
    return str(value)


def _rounded(value: float) -> str:
    """Three or four significant figures: ``284.1``, ``6.84``, ``0.0492`` (not ``6.840530000000001``)."""
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def print_summary(data: dict[str, Any]) -> None:
    status = ("FATAL: " + str(data["fatal_message"]) if data["engine_fatal"]
              else "STALLED: " + str(data["stall_message"]) if data.get("engine_stalled") else "healthy")
    if status == "healthy" and data.get("requests_errored"):
        # The engine served on, but not every request: say so where the verdict is read.
        status += f" (the engine served on; {data['requests_errored']} requests ended with an error response)"
    # The build leads: scenarios default to their report's build, the demo runs the newest one.
    print(f"replay {data['source']} on engine {build_label(data['engine_version'])}: {status}")
    for key in ("requests_total", "requests_completed", "requests_failed", "requests_errored", "requests_rejected",
                "sim_seconds", "wall_seconds", "peak_utilization", "prefix_hit_rate",
                "goodput_tokens_per_s", "mean_running_requests", "queue_wait_p50_s", "queue_wait_p99_s",
                "remediation", "sizing", "reservations_leaked", "requests_contained", "rejected_by_reason",
                "deferrals"):
        value = data[key]
        if key == "remediation" and isinstance(value, dict) and (
                value.get("started_mode"), value.get("started_policy")) == (value.get("mode"), value.get("policy")):
            # Where it started is news only when a switch during the run changed it.
            value = {k: v for k, v in value.items() if k not in ("started_mode", "started_policy")}
        print(f"  {key:<22} {value_text(key, value)}")
        if key == "requests_rejected" and data.get("requests_cancelled"):
            print(f"  {'requests_cancelled':<22} {data['requests_cancelled']}")
        if key == "requests_rejected" and data.get("requests_unfinished"):
            # A replay cut short (max_sim_seconds, a stall) leaves requests in the engine; without
            # this row the counts above would not add up to requests_total and read as all served.
            print(f"  {'requests_unfinished':<22} {data['requests_unfinished']} "
                  "(still running or queued when the replay stopped)")
