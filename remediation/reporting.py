"""Remediation's own facts as events, through the ``Emit`` callable the engine adapter hands over.

Time, iteration, rank and pid are the recorder's: the adapter's ``emit_event`` stamps them (a policy
has no clock of its own), so the placeholders below never reach a file.
"""

from __future__ import annotations

from kvscope.events import UNKNOWN, Emit, EventKind, KVEvent, PoolRole


def _discard(_event: KVEvent) -> None:
    return None


class Reporter:
    """Builds and emits one :class:`KVEvent` per remediation decision (``emit`` None: discarded)."""

    def __init__(self, emit: Emit | None = None, *, prefix: str = "") -> None:
        self.emit: Emit = emit or _discard
        self.prefix = prefix
        """Prepended to every reason (``"shadow: "`` while decisions change nothing)."""

    def report(self, kind: EventKind, request_id: int = -1, pool: PoolRole = PoolRole.NONE,
               num_blocks: int = 0, num_tokens: int = 0, reason: str = "", *,
               reserved_blocks: int = UNKNOWN) -> None:
        self.emit(KVEvent(0, -1, 0, 0, request_id, pool, kind, num_blocks, num_tokens, 0,
                          UNKNOWN, UNKNOWN, UNKNOWN, reserved_blocks, self.prefix + reason))
