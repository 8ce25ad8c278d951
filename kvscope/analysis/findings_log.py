"""FindingsLog: the streaming analyzer's bounded list of findings, which the rules append to and
update in place as their episodes go on.

A finding is addressed by the handle :meth:`FindingsLog.add` returns (its position counted from
the stream's first finding), so dropping the oldest for the bound moves no one's handle: a handle
whose finding was dropped is no longer :meth:`~FindingsLog.alive`. Pure Python, no pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kvscope.analysis.findings import Finding


@dataclass(slots=True)
class Episode:
    """An admission-gap or time-to-exhaustion episode in progress: its finding's handle in the log
    and what the next step of the rule needs."""

    handle: int  # its finding in the FindingsLog
    last_it: int
    names: list
    opening: str = ""  # a time-to-exhaustion finding's opening sentence (its end text follows)
    opening_what: str = ""  # the basis in words where it opened
    peak: float = math.nan  # fullest the pool was at an at-risk iteration of the episode
    est_finite: bool = False  # the opening already carries a finite estimate
    arrivals: list = field(default_factory=list)  # (request, iteration) arrived since its last step
    n_admitted: int = 0  # an admission gap's names: this many admitted into the debt, then the owing
    num_named: int = 0  # a time-to-exhaustion episode's requests, named or over the cap
    pending_arrivals: int = 0  # arrivals since its last step (counted in num_named if it goes on)
    turn: str = ""  # where and why a time-to-exhaustion episode that opened as a warning turned critical


class FindingsLog:
    """At most ``max_findings`` findings in the order they were raised (oldest dropped first,
    counted in ``dropped``), and the handles of those that turned critical since :meth:`take_turned`."""

    def __init__(self, max_findings: int) -> None:
        self.max_findings = max_findings
        self.items: list[Finding] = []
        self.dropped = 0
        self.turned: list[int] = []  # handles of findings raised earlier that turned critical

    @property
    def next_handle(self) -> int:
        """The handle the next finding gets (findings raised so far, dropped included)."""
        return self.dropped + len(self.items)

    def position_of(self, handle: int) -> int:
        """Where the finding with ``handle`` is (or would be, for one not yet added) in
        :attr:`items`; 0 for one already dropped: ``items[position_of(h):]`` are the findings kept
        of those added since :attr:`next_handle` was ``h``."""
        return max(handle - self.dropped, 0)

    def add(self, f: Finding) -> int:
        if len(self.items) >= self.max_findings:
            self.items.pop(0)
            self.dropped += 1
        self.items.append(f)
        return self.dropped + len(self.items) - 1

    def alive(self, h: int) -> bool:
        return 0 <= h - self.dropped < len(self.items)

    def get(self, h: int) -> Finding:
        return self.items[h - self.dropped]

    def put(self, h: int, f: Finding) -> None:
        self.items[h - self.dropped] = f

    def set_end(self, h: int, t: float, it: int) -> None:
        """The finding (if still kept) ends at (t, it), never before its start."""
        if self.alive(h):
            f = self.get(h)
            self.put(h, replace(f, t_end_s=max(t, f.t_start_s), iteration_end=it))

    def take_turned(self, first_new: int) -> list[Finding]:
        """Findings kept before position ``first_new`` of :attr:`items` that turned critical since
        the last call, as they stand now (each once)."""
        turned, self.turned = self.turned, []
        d = self.dropped
        return [self.items[h - d] for h in dict.fromkeys(turned) if 0 <= h - d < first_new]
