"""ResourceManagerModel: draft prepares before target, free runs reversed, raises propagate."""

from __future__ import annotations

import pytest

from kvscope.engine_model.resource_manager import ResourceManagerType, create_resource_manager


class RecordingManager:
    """A data recorder standing in for a manager's hooks (records call order only)."""

    def __init__(self, name: str, calls: list[str], fail_prepare: bool = False) -> None:
        self.name, self.calls, self.fail_prepare = name, calls, fail_prepare

    def prepare_resources(self, batch):
        self.calls.append(f"prepare:{self.name}")
        if self.fail_prepare:
            raise RuntimeError("Draft KV cache context resize failed for request 7: could not resize to 128 tokens")

    def update_resources(self, batch, attn_metadata=None, kv_cache_dtype_byte_size=None):
        self.calls.append(f"update:{self.name}")

    def free_resources(self, request):
        self.calls.append(f"free:{self.name}")


def test_draft_prepares_before_target_when_created_like_executor():
    calls: list[str] = []
    rm = create_resource_manager(RecordingManager("target", calls), RecordingManager("draft", calls))
    assert rm.order == [ResourceManagerType.DRAFT_KV_CACHE_MANAGER, ResourceManagerType.KV_CACHE_MANAGER]
    rm.prepare_resources(None)
    rm.update_resources(None)
    rm.free_resources(None)
    assert calls == ["prepare:draft", "prepare:target", "update:draft", "update:target",
                     "free:target", "free:draft"]


def test_draft_raise_propagates_and_target_not_prepared_when_draft_fails():
    calls: list[str] = []
    rm = create_resource_manager(RecordingManager("target", calls),
                                 RecordingManager("draft", calls, fail_prepare=True))
    with pytest.raises(RuntimeError, match="Draft KV cache context resize failed for request 7"):
        rm.prepare_resources(None)
    assert calls == ["prepare:draft"]


def test_reorder_pipeline_rejects_when_not_every_manager_named():
    calls: list[str] = []
    rm = create_resource_manager(RecordingManager("target", calls), RecordingManager("draft", calls))
    with pytest.raises(ValueError, match="must name every registered manager"):
        rm.reorder_pipeline([ResourceManagerType.KV_CACHE_MANAGER])
