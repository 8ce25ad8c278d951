"""What names a recorded run to its reader: the engine build it ran, and, beside other runs, the
scenario, build and knobs that tell it apart from them.

A scenario replays by default on its report's build (glm5-dsa: 1.3.0rc25) while the demo runs the
newest one read (main-00746ef), and the two die on different requests with different messages: a
verdict or a comparison that does not say which build it read cannot be checked against another.
Every event file header stores ``meta["engine_version"]``; a file without one reads as
:data:`UNKNOWN_BUILD`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvscope.analysis.columns import EventColumns, as_columns
from kvscope.events import EventKind, parse_kv

UNKNOWN_BUILD = "unknown build"

_SAID_ELSEWHERE = ("engine_version",)
"""Knobs a label never lists as differing: the build is said on its own."""


def engine_version_of(meta: Mapping[str, Any]) -> str | None:
    """The header's ``engine_version`` (``model-of-1.3.0rc25``, ``1.3.0rc25``), None when it has none.

    An engine-model recording's knobs say which build the model ran, and they win over the label:
    some recordings' label reads ``model-of-main-00746ef`` whatever build their knobs name.
    """
    knob = (meta.get("knobs") or {}).get("engine_version")
    if meta.get("engine") == "engine_model" and knob:
        return f"model-of-{knob}"
    version = meta.get("engine_version")
    return str(version) if version not in (None, "") else None


def build_text(meta: Mapping[str, Any]) -> str:
    """``engine model-of-1.3.0rc25``, or ``unknown build`` for a header without ``engine_version``."""
    version = engine_version_of(meta)
    return f"engine {version}" if version else UNKNOWN_BUILD


def remediation_at_start(events: Any) -> str:
    """The remediation mode a recording started in (its first REMEDIATION_MODE_CHANGED at iteration
    0: ``on``, ``shadow``, ...), ``off`` when none was attached then."""
    ev: EventColumns = as_columns(events)
    pos = ev.positions(EventKind.REMEDIATION_MODE_CHANGED)
    if len(pos) and int(ev.iteration[pos[0]]) == 0:
        return str(parse_kv(ev.reason_at(pos[:1])[0]).get("mode") or "off")
    return "off"


def run_descriptions(metas: Sequence[Mapping[str, Any]], remediation: Sequence[str] | None = None) -> list[str]:
    """One description per compared run: ``scenario on engine X, knob=value ...`` (a label is the
    run's file name, then its description in parentheses).

    Args:
        metas: each run's header ``meta`` (``scenario``, ``engine_version``, ``knobs``).
        remediation: each run's :func:`remediation_at_start`, listed like a knob when it differs.

    Only the knobs whose values differ between the runs are named (a knob one run's header lacks
    differs), in knob order, as ``--set`` takes them (``enable_block_reuse=false``).
    """
    knobs = [dict(m.get("knobs") or {}) for m in metas]
    if remediation is not None:
        for k, mode in zip(knobs, remediation):
            k["remediation"] = mode
    order: list[str] = []
    for k in knobs:
        order += [name for name in k if name not in order and name not in _SAID_ELSEWHERE]
    differing = [name for name in order if len({_text(k[name]) if name in k else None for k in knobs}) > 1]
    descriptions = []
    for meta, k in zip(metas, knobs):
        parts = [f"{meta.get('scenario') or 'unknown scenario'} on {build_text(meta)}"]
        parts += [f"{knob}={_text(k[knob])}" for knob in differing if knob in k]
        descriptions.append(", ".join(parts))
    return descriptions


def _text(value: Any) -> str:
    """A knob value as ``--set`` takes it (``true``, ``0.5``, ``paired``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
