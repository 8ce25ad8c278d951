"""ResourceManagerModel: the executor's ordered set of resource managers, draft before target.

Stands for ``ResourceManager`` in ``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (read in
the stored versions of that file; the method bodies are the same in every version read, and the map
places them at 0004396720054fd8e205cbf616f21f0b57c6b412):

- ``resource_managers`` is an ordered dict keyed by ``ResourceManagerType``;
- ``prepare_resources(scheduled_batch)`` calls each manager's ``prepare_resources`` in order;
- ``update_resources(scheduled_batch, attn_metadata, kv_cache_dtype_byte_size)`` calls each in order
  (KV managers get the extra two arguments);
- ``free_resources(request)`` calls each manager in REVERSED order;
- ``reorder_pipeline(types)`` moves the named managers to the end, in the given order.

``create_resource_manager`` does what ``create_py_executor_instance`` (``_util.py`` @ 0004396) does to
the order: it moves ``KV_CACHE_MANAGER`` (the target) to the end, so the DRAFT manager's
``prepare_resources`` (``_prepare_draft_resources``: the raise sites) runs before the target's, and
``free_resources`` frees the target first. No exception is caught here: a raise from a manager
propagates to the executor loop, which is what makes it fatal.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum
from typing import Any, Protocol


class ResourceManagerType(str, Enum):
    """Keys of ``ResourceManager.resource_managers`` (real names)."""

    KV_CACHE_MANAGER = "KV_CACHE_MANAGER"
    DRAFT_KV_CACHE_MANAGER = "DRAFT_KV_CACHE_MANAGER"
    CROSS_KV_CACHE_MANAGER = "CROSS_KV_CACHE_MANAGER"
    PEFT_CACHE_MANAGER = "PEFT_CACHE_MANAGER"
    SEQ_SLOT_MANAGER = "SEQ_SLOT_MANAGER"
    SPEC_RESOURCE_MANAGER = "SPEC_RESOURCE_MANAGER"


class ManagerLike(Protocol):
    """What a member manager may implement (each hook is optional, as ``hasattr`` is used)."""

    def free_resources(self, request: Any) -> None: ...


class ResourceManagerModel:
    """Ordered managers; every hook iterates them in the real order and lets exceptions through."""

    def __init__(self, resource_managers: dict[ResourceManagerType, Any] | None = None) -> None:
        self.resource_managers: OrderedDict[ResourceManagerType, Any] = OrderedDict(resource_managers or {})

    def add_resource_manager(self, name: ResourceManagerType, resource_manager: Any) -> None:
        self.resource_managers[name] = resource_manager

    def get_resource_manager(self, name: ResourceManagerType) -> Any | None:
        return self.resource_managers.get(name)

    def prepare_resources(self, scheduled_batch: Any) -> None:
        """Each manager's ``prepare_resources`` in order. Not guarded: a raise ends the caller's loop."""
        for resource_manager in self.resource_managers.values():
            if hasattr(resource_manager, "prepare_resources"):
                resource_manager.prepare_resources(scheduled_batch)

    def update_resources(self, scheduled_batch: Any, attn_metadata: Any = None,
                         kv_cache_dtype_byte_size: float | None = None) -> None:
        for name, resource_manager in self.resource_managers.items():
            if hasattr(resource_manager, "update_resources"):
                if name in _KV_TYPES:
                    resource_manager.update_resources(scheduled_batch, attn_metadata, kv_cache_dtype_byte_size)
                else:
                    resource_manager.update_resources(scheduled_batch)

    def free_resources(self, request: Any) -> None:
        """Each manager's ``free_resources`` in REVERSED order (target first once it is last)."""
        for resource_manager in reversed(self.resource_managers.values()):
            if hasattr(resource_manager, "free_resources"):
                resource_manager.free_resources(request)

    def reorder_pipeline(self, resource_manager_list: list[ResourceManagerType]) -> None:
        if set(resource_manager_list) != set(self.resource_managers):
            raise ValueError("reorder_pipeline must name every registered manager exactly once")
        for name in resource_manager_list:
            self.resource_managers.move_to_end(name)

    @property
    def order(self) -> list[ResourceManagerType]:
        """Manager keys in ``prepare_resources`` order."""
        return list(self.resource_managers)


_KV_TYPES = frozenset({ResourceManagerType.KV_CACHE_MANAGER, ResourceManagerType.DRAFT_KV_CACHE_MANAGER,
                       ResourceManagerType.CROSS_KV_CACHE_MANAGER})


def create_resource_manager(kv_cache_manager: Any, draft_kv_cache_manager: Any | None = None,
                            extra: dict[ResourceManagerType, Any] | None = None) -> ResourceManagerModel:
    """Build the managers in construction order, then move the target to the end.

    Construction registers the target first (``KvCacheCreator.build_managers`` puts KV_CACHE_MANAGER
    and then DRAFT_KV_CACHE_MANAGER into the resources dict); ``create_py_executor_instance`` then
    moves KV_CACHE_MANAGER to the end, so the final order is ``[extras..., DRAFT, TARGET]``.
    """
    managers: OrderedDict[ResourceManagerType, Any] = OrderedDict()
    managers[ResourceManagerType.KV_CACHE_MANAGER] = kv_cache_manager
    if draft_kv_cache_manager is not None:
        managers[ResourceManagerType.DRAFT_KV_CACHE_MANAGER] = draft_kv_cache_manager
    for name, manager in (extra or {}).items():
        managers[name] = manager
    resource_manager = ResourceManagerModel(managers)
    resource_manager.resource_managers.move_to_end(ResourceManagerType.KV_CACHE_MANAGER)
    return resource_manager
