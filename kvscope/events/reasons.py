"""Compact ``key=value`` reasons, for facts that carry a few named numbers (e.g. POOL_CONFIGURED).

``format_kv({"tokens_per_block": 64, "paired": 0})`` -> ``"tokens_per_block=64 paired=0"``. Values
are ints, floats or bare words (no spaces). Parsing is forgiving: tokens without ``=`` are ignored.
"""

from __future__ import annotations


def format_kv(values: dict[str, int | float | str | bool]) -> str:
    parts = []
    for k, v in values.items():
        if isinstance(v, bool):
            v = int(v)
        s = str(v)
        if not k or " " in k or "=" in k or " " in s:
            raise ValueError(f"key/value must be non-empty words without spaces: {k!r}={s!r}")
        parts.append(f"{k}={s}")
    return " ".join(parts)


def parse_kv(reason: str) -> dict[str, int | float | str]:
    out: dict[str, int | float | str] = {}
    for tok in reason.split():
        k, sep, v = tok.partition("=")
        if not sep or not k:
            continue
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


REMEDIATION_PREFIX = "remediation: "
"""How an ADMISSION_DEFERRED reason starts when the admission policy (remediation), not the
engine, deferred the request: the analyzer reports those waits as remediation at work, not stalls."""


def remediation_reason(reason: str) -> str:
    """``reason`` marked as a deferral by the admission policy."""
    return REMEDIATION_PREFIX + reason


def is_remediation_reason(reason: str) -> bool:
    return reason.startswith(REMEDIATION_PREFIX)


ADOPTED_REASON = "adopted: started before remediation"
"""The RESERVATION_MADE reason for a request that was already running when remediation switched on:
the policy accounts its blocks; the request never waited for them (the analyzer's stall rule skips
these reservations)."""


def is_adopted_reason(reason: str) -> bool:
    return reason.startswith(ADOPTED_REASON)
