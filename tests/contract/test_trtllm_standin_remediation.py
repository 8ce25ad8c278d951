"""Remediation on the REAL TensorRT-LLM path, through the importable stand-in (the real module paths
and the signatures of ``snapshots/``; bodies reduced to the control flow the hooks meet).

* Rejection and containment: the binding learns the executor at ``PyExecutor._prepare_and_schedule_batch``
  and ends ONE request through its ``_handle_errors(msg, requests=[req], charge_budget=...)``: a
  never-fitting request is rejected with the pool, the blocks it needs and the blocks that exist; a
  draft resize failure fails only its request; the engine serves on; ``uninstrument()`` puts the
  originals back. Under pipeline parallelism on the real engine both stay off and the log says why.
* Configuration: the stand-in manager carries the recorded layout (no ``max_util_for_resume``
  attribute; the ceiling in ``kv_cache_manager_py_config`` / ``impl.init_config``, the pipeline size
  in ``mapping``): the policy is given the engine's ceiling, and without it remediation refuses to
  start in one line and the engine runs as stock.
* Sizing: ``KVSCOPE_SIZING`` re-splits the byte budget at ``KvCacheCreator._split_kv_cache_budget_for_draft``
  and yields the pool sizes the engine model's ``--sizing`` knob gives for the same plan.
"""

from __future__ import annotations

import json

import pytest
from test_trtllm_standin import _run, _standin

ENGINE = '''
import json, logging, sys
from types import SimpleNamespace
logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.recording import Recorder
from kvscope.app.remedy import attach_from_env
from tensorrt_llm._torch.pyexecutor.py_executor import PyExecutor
from tensorrt_llm._torch.pyexecutor.resource_manager import ResourceManager
from tensorrt_llm._torch.pyexecutor.scheduler.scheduler_v2 import KVCacheV2Scheduler
from tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2 import KVCacheManagerV2

# ---- stand-in bodies (the real control flow, reduced) ----
def _get_storage_statistics(self, cache_level):
    return [SimpleNamespace(total=self.capacity, available=self.capacity, evictable=0)]
def _prepare_draft_resources(self, scheduled_batch):
    for req in scheduled_batch.context_requests:
        if req.py_request_id == FAILING:
            raise RuntimeError(f"Failed to resize the draft cache of request {req.py_request_id} to 12 tokens")
def schedule_request(self, active_requests, inflight_request_ids):
    ctx = [r for r in active_requests if self._prepare_context_pair(r) and self._try_allocate_context(r, r.prompt_len)]
    return SimpleNamespace(context_requests=ctx, generation_requests=[], recompute_paused_requests=[])
def prepare_resources(self, scheduled_batch):
    self.resource_managers["draft"]._prepare_draft_resources(scheduled_batch)
def free_resources(self, request):
    for manager in self.resource_managers.values():
        manager.free_resources(request)
def _prepare_and_schedule_batch(self):
    return self.scheduler.schedule_request(self.active_requests, set()), None
def _handle_errors(self, error_msg=None, *, requests=None, charge_budget=True, fatal_is_collective_aligned=False):
    for req in list(self.active_requests) if requests is None else list(requests):
        self.errors[req.py_request_id] = (error_msg, charge_budget)
        self.active_requests.remove(req)
        self.resource_manager.free_resources(req)
KVCacheManagerV2._get_storage_statistics = _get_storage_statistics
KVCacheManagerV2._prepare_draft_resources = _prepare_draft_resources
KVCacheV2Scheduler.schedule_request = schedule_request
KVCacheV2Scheduler._prepare_context_pair = lambda self, req: True
KVCacheV2Scheduler._try_allocate_context = lambda self, req, num_tokens: True
ResourceManager.prepare_resources = prepare_resources
ResourceManager.free_resources = free_resources
PyExecutor._prepare_and_schedule_batch = _prepare_and_schedule_batch
PyExecutor._handle_errors = _handle_errors
originals = {name: vars(PyExecutor)[name] for name in ("_prepare_and_schedule_batch", "_handle_errors")}

def manager(is_draft, capacity):
    # The adapter's attributes where kv_cache_manager_v2.py @ 0004396 keeps them (snapshots/): no
    # max_util_for_resume of its own; it is in the core config built from kv_cache_config (kept as
    # kv_cache_manager_py_config, and by the core as impl.init_config); the pipeline size in mapping.
    m = object.__new__(KVCacheManagerV2)
    m.kv_cache_map, m.tokens_per_block, m.is_draft, m.capacity = {}, 4, is_draft, capacity
    m.enable_block_reuse, m.enable_joint_kv_cache_reuse, m.max_draft_len, m.num_extra_kv_tokens = True, False, 0, 0
    m.max_seq_len, m.mapping = 256, SimpleNamespace(pp_size=PP_SIZE, tp_size=1, world_size=PP_SIZE)
    if CEILING is not None:
        m.kv_cache_manager_py_config = SimpleNamespace(tokens_per_block=4, max_util_for_resume=CEILING,
                                                       cache_tiers=["gpu"])
        m.impl = SimpleNamespace(init_config=SimpleNamespace(max_util_for_resume=CEILING))
    return m
def request(rid, prompt):
    return SimpleNamespace(py_request_id=rid, prompt_len=prompt, max_new_tokens=2, context_current_position=0,
                           context_chunk_size=prompt, is_first_context_chunk=True, py_draft_tokens=None,
                           state=SimpleNamespace(name="CONTEXT_INIT"), num_generated_tokens=2)

rec = Recorder()
binding = instrument(recorder=rec, engine=None)
controller = attach_from_env(binding, ENV)
ex = object.__new__(PyExecutor)
ex.errors, ex.served = {}, []
ex.scheduler = object.__new__(KVCacheV2Scheduler)
ex.scheduler.kv_cache_manager, ex.scheduler.draft_kv_cache_manager = manager(False, 64), manager(True, 8)
ex.resource_manager = object.__new__(ResourceManager)
ex.resource_manager.resource_managers = {"draft": ex.scheduler.draft_kv_cache_manager,
                                         "target": ex.scheduler.kv_cache_manager}
def step():
    # The executor loop's order: schedule, prepare resources (a raise leaves the loop), finish.
    batch, _ = ex._prepare_and_schedule_batch()
    ex.resource_manager.prepare_resources(batch)
    for req in batch.context_requests:
        req.state = SimpleNamespace(name="GENERATION_COMPLETE")
        ex.served.append(req.py_request_id)
        ex.active_requests.remove(req)
        ex.resource_manager.free_resources(req)

FAILING = 3
ex.active_requests = [request(1, 10), request(2, 100), request(3, 10)]
fatal = None
try:
    step()
    ex.active_requests.append(request(4, 10))
    step()
except Exception as exc:
    fatal = str(exc)
pools = {r.value: [c.max_util_for_resume, c.is_visible] for r, c in controller.port.pool_configs().items()}
refused = controller.port.refused
uninstrument()
print(json.dumps({
    "pools": pools, "refused": refused,
    "served": ex.served, "errors": {str(k): v for k, v in sorted(ex.errors.items())}, "fatal": fatal,
    "restored": all(vars(PyExecutor)[n] is f for n, f in originals.items()),
    "events": [[e.kind.value, e.request_id, e.pool.value, e.reason] for e in rec.drain()
               if e.kind.value in ("admission_rejected", "admission_deferred", "request_failed",
                                   "failure_contained", "request_finished", "engine_failed")]}))
'''

REJECTED = ("request 2 can never fit the draft pool: it needs 26 blocks (100 prompt + 2 output tokens), "
            "the pool has 8")
CONTAINED = "Failed to resize the draft cache of request 3 to 12 tokens"


def _engine(tmp_path, env: dict[str, str], *, pp_size: int = 1, ceiling: float | None = 0.95) -> tuple[dict, str]:
    _standin(tmp_path, drift=False)
    done = _run(tmp_path, f"ENV, PP_SIZE, CEILING = {env!r}, {pp_size!r}, {ceiling!r}\n" + ENGINE)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_real_engine_rejects_and_contains_one_request_through_handle_errors_and_serves_on(tmp_path):
    result, _ = _engine(tmp_path, {"KVSCOPE_REMEDIATION": "on"})
    # The policy is given the resume ceiling the engine enforces, read from its core config (the
    # adapter has no max_util_for_resume of its own), not 1.0.
    assert result["pools"] == {"target": [0.95, True], "draft": [0.95, True]} and result["refused"] == ""
    assert result["fatal"] is None
    assert result["served"] == [1, 4]  # the engine kept serving: request 4 arrived after both ends
    assert result["errors"] == {"2": [REJECTED, False], "3": [CONTAINED, True]}
    assert result["events"] == [
        ["admission_rejected", 2, "none", REJECTED],
        ["request_failed", 2, "none", "error: " + REJECTED],
        ["request_failed", 3, "none", "error: " + CONTAINED],
        ["failure_contained", 3, "draft", "request failed alone, engine serves on: " + CONTAINED],
        ["request_finished", 1, "none", ""],
        ["request_finished", 4, "none", ""],
    ]
    assert result["restored"] is True


def test_real_engine_under_pipeline_parallelism_keeps_both_off_and_says_why(tmp_path):
    # The pipeline size is the engine's (mapping.pp_size): nothing declared in the environment.
    result, stderr = _engine(tmp_path, {"KVSCOPE_REMEDIATION": "on"}, pp_size=2)
    assert "rejections wait and containment is off" in stderr and "pipeline parallelism" in stderr
    assert result["pools"] == {"target": [0.95, True], "draft": [0.95, False]}  # the draft is on the last stage
    assert result["errors"] == {}  # nothing ended through the per-request path
    deferred = [e for e in result["events"] if e[0] == "admission_deferred" and e[1] == 2]
    assert deferred and deferred[0][3].endswith("(no per-request error path: waiting)")
    assert result["fatal"] == CONTAINED  # not contained: the draft raise stays fatal, as stock
    assert result["restored"] is True


STOCK_EVENTS = [["engine_failed", 3, "draft", "RuntimeError: " + CONTAINED]] + [
    ["request_failed", rid, "none", "engine failed: " + CONTAINED] for rid in (1, 2, 3)]


def test_real_engine_without_the_resume_ceiling_where_tensorrt_llm_keeps_it_refuses_remediation_in_one_line(tmp_path):
    result, stderr = _engine(tmp_path, {"KVSCOPE_REMEDIATION": "on"}, ceiling=None)
    why = ("cannot read max_util_for_resume from KVCacheManagerV2 (looked for kv_cache_manager_py_config."
           "max_util_for_resume and impl.init_config.max_util_for_resume; TensorRT-LLM keeps it there at 0004396)")
    assert result["refused"] == why
    assert stderr.splitlines() == [f"ERROR:kvscope.engines.gate:kvscope: remediation refused to start, the engine "
                                   f"runs as stock: {why}"]
    # Stock: nothing rejected or contained, the draft raise stays fatal.
    assert (result["errors"], result["fatal"], result["events"]) == ({}, CONTAINED, STOCK_EVENTS)


def test_a_declared_pipeline_size_the_engine_does_not_have_refuses_remediation(tmp_path):
    result, stderr = _engine(tmp_path, {"KVSCOPE_REMEDIATION": "on", "KVSCOPE_PP_SIZE": "1"}, pp_size=2)
    assert result["refused"] == "KVSCOPE_PP_SIZE=1 but the engine's mapping.pp_size is 2"
    assert "remediation refused to start" in stderr and result["events"] == STOCK_EVENTS


SPLIT = '''
import copy, json
from kvscope.engine_model.config import split_kv_cache_budget_for_draft as model_split
from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.recording import Recorder
from kvscope.app.sizing import sizing_from_env
from remediation.sizing import BudgetSplit
from tensorrt_llm._torch.pyexecutor._util import KvCacheCreator

class KvCacheConfig:
    def __init__(self, **values):
        self.__dict__.update(values)
    def model_copy(self):
        return copy.copy(self)

class CacheCost:
    def __init__(self, slope, intercept=0):
        self.slope, self.intercept = slope, intercept

def _split(self, budget_attr, target_kv_cache_config=None, draft_kv_cache_config=None):
    # The stock split's control flow; its arithmetic is the engine model's re-expression of it.
    target = target_kv_cache_config if target_kv_cache_config is not None else self._kv_cache_config
    total = getattr(target, budget_attr) or 0
    if total <= 0:
        return target, draft_kv_cache_config
    costs = self._get_target_and_draft_cache_costs(target)
    if costs is None:
        return target, draft_kv_cache_config
    t, d = costs
    if budget_attr != "max_gpu_total_bytes":
        t, d = CacheCost(t.slope), CacheCost(d.slope)
    shares = model_split(total, target_slope=t.slope, target_intercept=t.intercept, draft_slope=d.slope,
                         draft_intercept=d.intercept)
    out_target = target.model_copy()
    setattr(out_target, budget_attr, shares.target_bytes)
    out_draft = (draft_kv_cache_config if draft_kv_cache_config is not None else target).model_copy()
    setattr(out_draft, budget_attr, shares.draft_bytes)
    return out_target, out_draft
KvCacheCreator._split_kv_cache_budget_for_draft = _split
KvCacheCreator._get_target_and_draft_cache_costs = lambda self, config: (self.target_cost, self.draft_cost)
original = vars(KvCacheCreator)["_split_kv_cache_budget_for_draft"]

creator = object.__new__(KvCacheCreator)
creator._kv_cache_config = KvCacheConfig(max_gpu_total_bytes=TOTAL, host_cache_size=TOTAL)
creator.target_cost, creator.draft_cost = CacheCost(*TARGET), CacheCost(*DRAFT)
rec = Recorder()
binding = instrument(recorder=rec, engine=None)
out = {"stock": [c.max_gpu_total_bytes for c in creator._split_kv_cache_budget_for_draft("max_gpu_total_bytes")]}
sizing_from_env(binding, {"KVSCOPE_SIZING": PLAN})
out["sized"] = [c.max_gpu_total_bytes for c in creator._split_kv_cache_budget_for_draft("max_gpu_total_bytes")]
out["host"] = [c.host_cache_size for c in creator._split_kv_cache_budget_for_draft("host_cache_size")]
binding.budget_split = BudgetSplit(draft_byte_share=1.5)  # a plan that cannot apply: the stock split stands
out["broken"] = [c.max_gpu_total_bytes for c in creator._split_kv_cache_budget_for_draft("max_gpu_total_bytes")]
out["wrapped"] = vars(KvCacheCreator)["_split_kv_cache_budget_for_draft"] is not original
uninstrument()
out["restored"] = vars(KvCacheCreator)["_split_kv_cache_budget_for_draft"] is original
out["events"] = [[e.kind.value, e.pool.value, e.num_blocks, e.reason] for e in rec.drain()
                 if e.kind.value == "pool_sized"]
print(json.dumps(out))
'''


def _blocks(num_bytes: int, fixed: int, per_token: int, tokens_per_block: int) -> int:
    return (num_bytes - fixed) // per_token // tokens_per_block


@pytest.mark.parametrize("plan", ["4x", "0.09"])
def test_sizing_through_the_real_budget_split_agrees_with_the_engine_model_knob(tmp_path, plan):
    from kvscope.app.sizing import sized_config
    from kvscope.replay.scenarios import get_scenario

    config = get_scenario("glm5-dsa").config
    target = (config.target_bytes_per_token, config.target_fixed_bytes)
    draft = (config.draft_bytes_per_token, config.draft_fixed_bytes)
    _standin(tmp_path, drift=False)
    done = _run(tmp_path, f"TOTAL, TARGET, DRAFT, PLAN = {config.max_gpu_total_bytes}, {target}, {draft}, {plan!r}\n"
                + SPLIT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    tpb = config.tokens_per_block

    def blocks(pair: list[int]) -> tuple[int, int]:
        return _blocks(pair[0], target[1], target[0], tpb), _blocks(pair[1], draft[1], draft[0], tpb)

    assert blocks(out["stock"]) == config.pool_blocks()  # the stand-in's stock split is the model's
    sized, sizing_plan = sized_config(config, plan)
    assert blocks(out["sized"]) == sized.pool_blocks() == (sizing_plan.target_blocks, sizing_plan.draft_blocks)
    assert blocks(out["sized"])[1] > 3 * blocks(out["stock"])[1]  # the draft pool really grew
    assert out["host"] == out["stock"]  # only the GPU budget is re-split
    assert out["broken"] == out["stock"]
    label = "draft_token_ratio_4x" if plan == "4x" else "draft_byte_share_0.09"
    assert out["events"][0] == ["pool_sized", "draft", out["sized"][1],
                                f"budget=max_gpu_total_bytes total_bytes={config.max_gpu_total_bytes} "
                                f"target_before={out['stock'][0]} draft_before={out['stock'][1]} "
                                f"target_after={out['sized'][0]} draft_after={out['sized'][1]} plan={label}"]
    assert len(out["events"]) == 2 and out["events"][1][3].startswith(
        "stock split kept: sizing failed (ValueError: draft byte share must be in (0, 1), got 1.5)")
    assert (out["wrapped"], out["restored"]) == (True, True)
