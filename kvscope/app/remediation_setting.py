"""The remediation setting ``MODE[:POLICY]``: one parser for every place that takes it.

``kvscope replay --remediation``, ``KVSCOPE_REMEDIATION`` (checked by ``kvscope-instrument`` before
the command runs, read again by every worker it starts), the notebook layer's ``remediation=``
argument and ``kvscope remediation set`` (where a bare mode keeps the engine's policy) all read a setting through :func:`parse_remediation_setting`, so they accept the same forms
and refuse the others with the same message. The mode and policy names are ``remediation``'s own
(``remediation.MODES`` and the ``remediation.POLICIES`` registry).
"""

from __future__ import annotations

from typing import NamedTuple

from remediation import DEFAULT_POLICY, MODES, POLICIES

__all__ = ["RemediationSetting", "parse_remediation_setting"]


class RemediationSetting(NamedTuple):
    """A mode and the admission policy it runs with (the default policy when none was named)."""

    mode: str
    """off | shadow | on | auto."""
    policy: str
    """A name of the ``remediation.POLICIES`` registry."""


def parse_remediation_setting(value: str) -> RemediationSetting:
    """``MODE``, ``POLICY`` (mode ``on``) or ``MODE:POLICY``, any case, spaces around the parts
    ignored; empty is ``off``.

    Raises:
        ValueError: any other form or name, as one line listing the modes and policies (callers
            prefix the flag or variable they read it from).
    """
    text = value.strip().lower()
    if not text:
        return RemediationSetting("off", DEFAULT_POLICY)
    head, sep, tail = (part.strip() for part in text.partition(":"))
    if head in MODES and (not sep or tail in POLICIES):
        return RemediationSetting(head, tail or DEFAULT_POLICY)
    if head in POLICIES and not sep:
        return RemediationSetting("on", head)
    raise ValueError(f"expected MODE[:POLICY] or POLICY, any case (modes: {', '.join(MODES)}; "
                     f"policies: {', '.join(POLICIES)}), got {value!r}")
