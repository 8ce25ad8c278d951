"""What ``kvscope replay`` offers, without running a replay: ``--list-scenarios``, ``--list-knobs``,
``--list-policies`` and ``--describe-build`` (each as text, or one JSON object with ``--json``)."""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

from kvscope.engine_model.config import EngineConfig
from kvscope.replay.scenarios import SCENARIOS, get_scenario


def scenarios_text() -> str:
    lines = ["built-in scenarios (what each is, and what it shows):"]
    for name in sorted(SCENARIOS):
        scenario = SCENARIOS[name]
        lines.append(f"  {name}")
        for text in (scenario.description, "shows: " + scenario.shows if scenario.shows else ""):
            lines.extend(textwrap.wrap(text, width=96, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def print_scenarios(*, as_json: bool) -> None:
    if as_json:
        table = {name: {"description": s.description, "shows": s.shows} for name, s in SCENARIOS.items()}
        sys.stdout.write(json.dumps(table, sort_keys=True) + "\n")
        return
    print(scenarios_text())


def print_policies(*, as_json: bool) -> None:
    from remediation import DEFAULT_POLICY, list_policies

    policies = list_policies()
    if as_json:
        sys.stdout.write(json.dumps({"default": DEFAULT_POLICY, "policies": policies}, sort_keys=True) + "\n")
        return
    width = max(len(n) for n in policies)
    for name, text in policies.items():
        print(f"{name:<{width}}  {text}")


def describe_build(source: str, overrides: list[str], *, as_json: bool) -> None:
    """The build a replay with these arguments would run, feature by feature, with its provenance."""
    build = get_scenario(source).config.with_overrides(list(overrides)).engine_build
    features = build.features()
    if as_json:
        sys.stdout.write(json.dumps({
            "engine_version": build.version, "build": build.build, "scheduler_source": build.scheduler_source,
            "kv_manager_source": build.kv_manager_source,
            "features": [{"name": n, "value": v if isinstance(v, (bool, int, str)) else str(v), "provenance": p}
                         for n, v, p in features]}) + "\n")
        return
    inferred = sum(1 for _, _, p in features if p != "read")
    print(f"engine {build.label}: {len(features) - inferred} behaviours read at its code, {inferred} inferred")
    print(f"  scheduler: {build.scheduler_source}")
    print(f"  manager:   {build.kv_manager_source}")
    width = max(len(n) for n, _, _ in features)
    for name, value, provenance in features:
        shown = value.value if hasattr(value, "value") else value
        print(f"  {name:<{width}}  {shown!s:<8}  {provenance}")


def print_knobs(scenario: str | None, *, as_json: bool) -> None:
    names = [scenario] if scenario else sorted(SCENARIOS)
    table = {name: get_scenario(name).config.to_dict() for name in names}
    if as_json:
        sys.stdout.write(json.dumps(table, sort_keys=True) + "\n")
        return
    descriptions = EngineConfig.describe_knobs()
    width = max(len(n) for n, _, _ in descriptions)
    # Each column as wide as its widest cell, header included: at a fixed width a long scenario name
    # (mooncake-conversation) would push its header, and every header after it, off its values.
    widths = {s: max([len(s)] + [len(_fmt(table[s][n])) for n, _, _ in descriptions]) for s in names}
    ranges = {n: _range_text(n) for n, _, _ in descriptions}
    range_width = max(len("range"), *(len(r) for r in ranges.values()))
    header = "  ".join(f"{s:>{widths[s]}}" for s in names)
    print(f"{'knob':<{width}}  {header}  {'range':>{range_width}}  description")
    for name, help_text, is_real in descriptions:
        values = "  ".join(f"{_fmt(table[s][name]):>{widths[s]}}" for s in names)
        marker = "" if is_real else " [model]"
        print(f"{name:<{width}}  {values}  {ranges[name]:>{range_width}}  {help_text}{marker}")


def _range_text(name: str) -> str:
    """What ``--set name=...`` accepts: the numeric range, or ``-`` (a flag, a name or an enum: its
    description says the values)."""
    bounds = EngineConfig.knob_range(name)
    return bounds.text() if bounds is not None else "-"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
