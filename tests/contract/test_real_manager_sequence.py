"""The engine model's runtime core against outcomes measured on the real one.

``real_manager_sequence.json`` holds what TensorRT-LLM's own KV cache manager V2 runtime
(``tensorrt_llm/runtime/kv_cache_manager_v2``, reassembled outside the repository as
``../shared/tools/real-manager`` describes and run on CPU through its accounting-only driver) decided
for the tool's driver sequence: a target pool where eight 1,120-token prompts share a 1,024-token prefix
and commit, and a draft pool of mirrors created without a match and sized to prompt + 3 draft slots,
96 slots each; once on the GPU tier alone, once with a host tier where a failed mirror resize suspends
the oldest mirror, retries, then tries to resume the suspended one. Numbers only, no upstream code.
The model's core (``kvscope.engine_model.core_manager``) replays the same calls and must make every
decision and reach every pool count the real core reached (SOURCES.md, "Installed-class replays").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.engine_model.core_manager import KVCacheManagerCoreModel, ReuseInputModel
from kvscope.engine_model.radix_tree import BlockLevel

REAL = json.loads((Path(__file__).parent / "real_manager_sequence.json").read_text())
TPB, PREFIX, SUFFIX, DRAFT_LEN = 32, 1024, 96, 3


def _counts(manager: KVCacheManagerCoreModel, level: int = BlockLevel.GPU) -> list[dict[str, int]]:
    s = manager.pool.statistics(level)
    return [dict(total=s.total, free=s.free, evictable=s.evictable, unavailable=s.unavailable)]


def _replay(host: bool) -> dict:
    """The real driver's calls on the model's core; the real config's max_util_for_resume (0.97) and
    the real run's slot counts (96 GPU slots; the draft host tier 1,927 slots)."""
    target = KVCacheManagerCoreModel(96, TPB, num_host_blocks=256 if host else 0, max_util_for_resume=0.97)
    draft = KVCacheManagerCoreModel(96, TPB, num_host_blocks=1927 if host else 0, max_util_for_resume=0.97)
    caches, mirrors, steps = {}, {}, []
    for rid in range(8):
        n = PREFIX + SUFFIX
        keys = list(range(1, PREFIX // TPB + 1)) + [(rid + 1) * 100000 + j for j in range(SUFFIX // TPB)]
        step: dict = dict(rid=rid, prompt_len=n)
        kv = target.create_kv_cache(None, ReuseInputModel(n - 1, keys), id=rid)
        step["target_reused_tokens"] = kv.num_committed_tokens
        step["target_resume"] = kv.resume()
        step["target_resize"] = kv.resize(n) if step["target_resume"] else None
        if step["target_resize"]:
            kv.commit(n - kv.num_committed_tokens, keys)
        caches[rid] = kv
        mirror = draft.create_kv_cache(None, None, id=rid)
        mirror.stop_committing()
        step["draft_resume"] = mirror.resume()
        step["draft_resize"] = mirror.resize(n + DRAFT_LEN) if step["draft_resume"] else None
        mirrors[rid] = mirror
        if not step["draft_resize"] and host:
            victims = [r for r, c in mirrors.items() if r != rid and c.is_active]
            if victims:
                mirrors[victims[0]].suspend()
                step["suspended_draft"] = victims[0]
                if not mirror.is_active:
                    step["draft_resume_retry"] = mirror.resume()
                if mirror.is_active:
                    step["draft_resize_retry"] = mirror.resize(n + DRAFT_LEN)
                step["resume_suspended"] = mirrors[victims[0]].resume()
        step["target_gpu"] = _counts(target)
        step["draft_gpu"] = _counts(draft)
        if host:
            step["draft_host"] = _counts(draft, BlockLevel.HOST)
        steps.append(step)
    for c in [*caches.values(), *mirrors.values()]:
        c.close()
    return {"steps": steps, "target_after_close": _counts(target), "draft_after_close": _counts(draft)}


@pytest.mark.parametrize("run", REAL["runs"], ids=lambda r: r["label"])
def test_model_core_decides_as_the_real_core_when_replaying_the_driver_sequence(run):
    model = _replay(run["host"])
    for real_step, model_step in zip(run["steps"], model["steps"], strict=True):
        assert model_step == real_step, f"request {real_step['rid']}"
    assert model["target_after_close"] == run["target_after_close"]
    assert model["draft_after_close"] == run["draft_after_close"]


def test_recorded_sequence_holds_the_reports_two_failure_paths():
    """What makes the comparison worth having: the third mirror's resize fails with the target far
    from full, and with a host tier a suspended mirror cannot come back."""
    gpu_only, with_host = (r["steps"] for r in REAL["runs"])
    assert [s["draft_resize"] for s in gpu_only[:3]] == [True, True, False]
    assert gpu_only[2]["target_gpu"][0]["unavailable"] == 41
    assert with_host[2]["draft_resize_retry"] is True and with_host[2]["resume_suspended"] is False
