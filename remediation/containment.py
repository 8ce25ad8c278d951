"""FailureContainment: the second line of defence, when admission did not prevent a draft failure.

If a draft resize or resume still raises inside ``prepare_resources`` while remediation is
enforcing, the engine adapter asks :meth:`FailureContainment.should_contain`; on yes it ends only
that request through the engine's per-request error path (an error response; its caches freed in
every pool, so the policy's ledger releases it through the usual free), removes it from the batch
and prepares the rest of the batch. A request whose resume failed is failed, never deferred: a
deferred request would keep its place in the batch without a draft page table (upstream that
corrupted page tables; the engine model's unmapped-id check in the forward catches it).

What is contained: a draft-pool context resize, generation resize or resume failure in
``_prepare_draft_resources`` that names its request. What is not: failures elsewhere (the target's
``update_resources``, the scheduler's deadlock error, a raise naming no request of the batch), and,
on a real multi-rank engine, the other ranks' view: the draft pool lives on the last PP stage, so
its per-request error must travel with the stage's responses for rank 0 to drop the request too
(the engine model runs one set of state, so its ranks agree by construction).
"""

from __future__ import annotations

from typing import Any

from kvscope.events import EventKind, PoolRole


class FailureContainment:
    """Contains draft failures while the controller is enforcing (``on``, or ``auto`` once triggered)."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self.num_contained = 0
        self.by_pool: dict[str, int] = {}

    def should_contain(self, request_id: int, message: str) -> bool:
        return bool(self.controller.enforcing)

    def contained(self, request_id: int, pool: PoolRole, message: str) -> None:
        self.num_contained += 1
        self.by_pool[pool.value] = self.by_pool.get(pool.value, 0) + 1
        self.controller.reporter.report(EventKind.FAILURE_CONTAINED, request_id, pool, 0, 0,
                                        f"request failed alone, engine serves on: {message}"[:512])
