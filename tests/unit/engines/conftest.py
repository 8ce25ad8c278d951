"""Factories for the engine-model engines the binding is tested on (small, hand-built)."""

from __future__ import annotations

import pytest

from kvscope.engine_model.config import EngineConfig
from kvscope.engine_model.cost_model import CostModel
from kvscope.engine_model.executor import PyExecutorModel, SimClock
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.resource_manager import create_resource_manager
from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel
from kvscope.engines.instrumentor import uninstrument


class ListWorkload:
    """A fixed list of ``WorkloadRequest`` (open loop)."""

    tokens_per_block = 4

    def __init__(self, requests):
        self.requests = sorted(requests, key=lambda r: r.arrival_s)

    def pop_arrivals(self, now_s):
        out = [r for r in self.requests if r.arrival_s <= now_s]
        self.requests = [r for r in self.requests if r.arrival_s > now_s]
        return out

    def next_arrival_s(self):
        return self.requests[0].arrival_s if self.requests else None

    def on_finished(self, request_id, now_s, *, failed=False):
        return None

    def is_exhausted(self):
        return not self.requests


def make_engine(*, num_target_blocks: int = 16, num_draft_blocks: int = 16, tokens_per_block: int = 4,
                max_draft_len: int = 1, enable_block_reuse: bool = True,
                client_max_tokens: str = "none") -> PyExecutorModel:
    """``client_max_tokens``: what clients send as max_tokens (the knob; "none": the engine deduces
    max_seq_len - prompt, 64 here, so a policy reserving max_new_tokens sees the whole sequence)."""
    common = dict(tokens_per_block=tokens_per_block, max_seq_len=64, max_batch_size=4, max_num_tokens=64,
                  max_draft_len=max_draft_len, enable_block_reuse=enable_block_reuse)
    target = KVCacheManagerV2Model(num_blocks=num_target_blocks, **common)
    draft = KVCacheManagerV2Model(num_blocks=num_draft_blocks, is_draft=True, **common)
    scheduler = KVCacheV2SchedulerModel(4, 64, target, draft_kv_cache_manager=draft)
    config = EngineConfig(max_batch_size=4, max_num_tokens=64, max_seq_len=64,
                          tokens_per_block=tokens_per_block, max_draft_len=max_draft_len,
                          client_max_tokens=client_max_tokens)
    return PyExecutorModel(config, create_resource_manager(target, draft), scheduler,
                           CostModel.from_config(config), SimClock())


@pytest.fixture(name="make_engine")
def make_engine_fixture():
    """``make_engine(num_target_blocks=16, num_draft_blocks=16, ...)`` -> a small PyExecutorModel."""
    return make_engine


@pytest.fixture(name="list_workload")
def list_workload_fixture():
    return ListWorkload


@pytest.fixture(autouse=True)
def _always_uninstrument():
    yield
    uninstrument()
