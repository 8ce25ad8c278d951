"""Hand-built admission inputs for the policy and controller tests (no engine)."""

from __future__ import annotations

from kvscope.events import KVEvent, PoolRole
from kvscope.port import AdmissionRequest, PassView, PoolConfig

TARGET = PoolConfig(PoolRole.TARGET, 4, 100, max_draft_len=1)
DRAFT = PoolConfig(PoolRole.DRAFT, 4, 20, max_draft_len=1, max_util_for_resume=0.95, shares_prefix=False)


def make_view(iteration: int = 0, *, draft: PoolConfig = DRAFT, started=()) -> PassView:
    return PassView(iteration, {PoolRole.TARGET: TARGET, PoolRole.DRAFT: draft}, {}, 0, 0, lambda: list(started))


def make_request(rid: int, prompt: int = 10, output: int = 5, *, first: bool = True, position: int = 0):
    return AdmissionRequest(rid, prompt, output, position, first, 1)


class FakePort:
    """An AdmissionPort that records what is installed and what is emitted."""

    def __init__(self, *, error_path: bool = True) -> None:
        self.policy = None
        self.containment = None
        self.events: list[KVEvent] = []
        self.iteration = 0
        self.has_error_path = error_path
        self.history: list[object] = []

    def set_admission_policy(self, policy) -> None:
        self.policy = policy
        self.history.append(policy)

    def set_containment(self, handler) -> None:
        self.containment = handler

    def emitter(self):
        return self.events.append

    def kinds(self) -> list[str]:
        return [e.kind.value for e in self.events]
