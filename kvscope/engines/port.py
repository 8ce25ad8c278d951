"""BindingPort: the :class:`kvscope.port.EnginePort` read side and the admission write side over an
instrumented engine.

It reads the pools the binding has discovered (target and draft managers), through the same pool
reader the hooks use, so it works for the engine model and TensorRT-LLM alike. Call the read side
from the engine thread or between iterations (the managers are not thread-safe).

Write side: :meth:`BindingPort.set_admission_policy` assigns ``binding.admission_policy`` (one
attribute store, atomic under the GIL; the engine thread reads it once per context attempt), and
:meth:`BindingPort.set_containment` installs the second line of defence. Neither patches anything:
the binding's hooks consult them (:mod:`kvscope.engines.gate`), so ``uninstrument()`` restores the
original methods whatever was installed.

Rank visibility: the pools the scheduling rank cannot read (under pipeline parallelism the
one-model draft pool lives on the last stage) are withheld from the read side and from the policy's
per-pass view. The pipeline size is read from the engine (``mapping.pp_size`` on its managers,
:mod:`kvscope.engines.manager_config`); ``hidden_pools`` may declare more (:func:`hidden_pools_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvscope.engines import gate
from kvscope.engines.binding import Binding
from kvscope.engines.manager_config import EngineConfigMissing
from kvscope.events import UNKNOWN, Emit, PoolRole
from kvscope.port import AdmissionPolicy, ContainmentHandler, PoolConfig, PoolSnapshot

__all__ = ["BindingPort", "EngineConfigMissing", "hidden_pools_for"]


hidden_pools_for = gate.hidden_pools_for


class BindingPort:
    """Pool snapshots from an instrumentation's :class:`Binding`, and the admission write side.

    Args:
        binding: the active instrumentation's binding.
        hidden_pools: pools not resident on the scheduling rank beyond those the engine's pipeline
            size implies (see :func:`hidden_pools_for`).
        error_path: ``(request, message, charge_budget)`` ending ONE request through the engine's
            per-request error path (``PyExecutor._handle_errors(msg, requests=[request],
            charge_budget=...)``, the engine model's the same); None: the executor's own, learnt at
            its first ``_prepare_and_schedule_batch`` (until then rejections wait and containment
            is off).
        error_path_off: why the per-request error path must not be used on this engine (logged
            once when the executor is found); rejections wait and containment is off.
        pp_error_path_off: the same, applied only when the engine's ``mapping.pp_size`` is above 1
            (a real engine, whose ranks would not agree on ending one request).
        declared_pp_size: a pipeline size the operator declared (0: none); remediation refuses
            to start when the engine's is another.

    Raises:
        EngineConfigMissing: the engine's managers are known already and one lacks a value
            admission needs (one line: which, and where it was looked for).
        ValueError: a value out of range or a declared pipeline size the engine does not have.
    """

    def __init__(self, binding: Binding, *, hidden_pools: Iterable[PoolRole] = (),
                 error_path: Callable[[Any, str, bool], None] | None = None, error_path_off: str = "",
                 pp_error_path_off: str = "", declared_pp_size: int = 0) -> None:
        self.binding = binding
        remedy = gate.state_of(binding)
        remedy.hidden_pools = frozenset(hidden_pools)
        remedy.pp_error_path_off = pp_error_path_off
        remedy.declared_pp_size = int(declared_pp_size)
        if error_path_off:
            remedy.error_path_off = error_path_off
            remedy.error_path = None
        elif error_path is not None:
            remedy.error_path = error_path
        elif remedy.error_path is None and binding.executor is not None:
            remedy.error_path = gate.executor_error_path(binding.executor)
        if remedy.pp_size:
            gate.learn_pipeline(binding, remedy, remedy.pp_size)  # a re-attach: the engine's layout stands
        if binding.managers:
            # Known now (the engine model is built before remediation attaches): refuse to attach
            # rather than start without a value. A real engine's managers come later; the gate
            # refuses there (gate.pool_configs).
            gate.read_pools(binding, remedy)

    @property
    def refused(self) -> str:
        """Why remediation refused to start on this engine (empty: it did not)."""
        return gate.state_of(self.binding).refused

    # ---- read side --------------------------------------------------------------------------------
    def pool_snapshots(self) -> dict[PoolRole, PoolSnapshot]:
        out: dict[PoolRole, PoolSnapshot] = {}
        hidden = gate.state_of(self.binding).hidden_pools
        for manager in list(self.binding.managers.values()):
            role = self.binding.role(manager)
            if role in hidden:
                continue
            try:
                cap, free, evictable, reserved = self.binding.reader.state(manager)
                policy = self.binding.admission_policy
                if policy is not None and hasattr(policy, "reserved_blocks"):
                    reserved = int(policy.reserved_blocks(role))
                caches = manager.kv_cache_map
                held = sum(c.capacity for c in caches.values())
                out[role] = PoolSnapshot(role, cap, free, evictable, reserved, len(caches), held,
                                         int(manager.tokens_per_block))
            except Exception:
                out[role] = PoolSnapshot(role, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN)
        return out

    def pool_configs(self) -> dict[PoolRole, PoolConfig]:
        """Every discovered KV pool's configuration (visible or not)."""
        return dict(gate.pool_configs(self.binding, gate.state_of(self.binding)))

    @property
    def iteration(self) -> int:
        """The scheduler iteration the engine is at (the recorder's)."""
        return int(self.binding.rec.iteration)

    # ---- write side -------------------------------------------------------------------------------
    def set_admission_policy(self, policy: AdmissionPolicy | None) -> None:
        """Install ``policy`` (None: admission as stock). Takes effect at the next context attempt;
        a new policy is told about the running requests at its first pass."""
        self.binding.admission_policy = policy

    def set_containment(self, handler: ContainmentHandler | None) -> None:
        """Install the containment handler consulted when a draft resize/resume raises (None: fatal)."""
        gate.state_of(self.binding).containment = handler

    def set_error_path(self, error_path: Callable[[Any, str, bool], None] | None) -> None:
        gate.state_of(self.binding).error_path = error_path

    @property
    def has_error_path(self) -> bool:
        return gate.state_of(self.binding).error_path is not None

    def emitter(self) -> Emit:
        """An ``Emit`` that records remediation's own events on this binding's recorder."""
        return gate.event_emitter(self.binding)

    def counters(self) -> dict[str, int]:
        """The gate's own counts: rejections ended, failures contained, policy errors swallowed."""
        remedy = gate.state_of(self.binding)
        return {"rejected": remedy.num_rejected, "contained": remedy.num_contained,
                "policy_errors": remedy.num_policy_errors, "deferrals_repeated": remedy.num_deferrals_repeated,
                "refused": int(bool(remedy.refused))}
