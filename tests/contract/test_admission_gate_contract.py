"""One trivial admission policy through the engine model AND the TensorRT-LLM stand-in.

The policy defers every new request on the draft pool. Both engines must produce the same
ADMISSION_DEFERRED events (a refusal at ``_prepare_context_pair`` stops a non-chunked pass at the
head of the line), must not run the original preparation for a refused attempt, and must get the
very same functions back on ``uninstrument()``.
"""

from __future__ import annotations

import json

from test_trtllm_standin import _run, _standin

from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.engines.port import BindingPort
from kvscope.events import EventKind, remediation_reason
from kvscope.recording import Recorder
from kvscope.workloads.workload import WorkloadRequest

POLICY = '''
from kvscope.events import PoolRole
from kvscope.port import AdmissionDecision

class DeferDraft:
    name = "defer-draft"
    def begin_pass(self, view):
        pass
    def decide(self, request):
        if request.is_first_chunk:
            return AdmissionDecision.defer(PoolRole.DRAFT, "defer-draft: test", 3)
        return AdmissionDecision.admit()
    def release(self, request_id):
        pass
'''

namespace: dict = {}
exec(POLICY, namespace)  # the very same source runs in the stand-in's interpreter
DeferDraft = namespace["DeferDraft"]


def _deferrals(events) -> list[list]:
    return [[e.iteration, e.request_id, e.pool.value, e.num_blocks, e.reason] for e in events
            if e.kind is EventKind.ADMISSION_DEFERRED]


def test_engine_model_defers_exactly_as_the_policy_says():
    from tests_engine_factory import make_engine  # noqa: I001 - helper next to this file

    from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel

    original = vars(KVCacheV2SchedulerModel)["_prepare_context_pair"]
    engine = make_engine()
    rec = Recorder()
    BindingPort(instrument(recorder=rec, engine=engine)).set_admission_policy(DeferDraft())
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.add_request(WorkloadRequest(2, 0.0, 6, 2, (11,)))
    engine.step()
    engine.step()
    assert engine.scheduler.kv_cache_manager.kv_cache_map == {}
    uninstrument()
    assert vars(KVCacheV2SchedulerModel)["_prepare_context_pair"] is original
    assert _deferrals(rec.drain()) == EXPECTED


# The policy's reason, marked as the policy's (the analyzer reads the wait as remediation at work).
EXPECTED = [[0, 1, "draft", 3, remediation_reason("defer-draft: test")],
            [0, 2, "none", 0, "not tried: queue stopped at an earlier request, or waiting behind one "
                               "computing the same prefix"]]


def test_trtllm_standin_defers_exactly_as_the_policy_says(tmp_path):
    _standin(tmp_path)
    done = _run(tmp_path, POLICY + '''
import json
from types import SimpleNamespace
from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.engines.port import BindingPort
from kvscope.recording import Recorder
from tensorrt_llm._torch.pyexecutor.scheduler.scheduler_v2 import KVCacheV2Scheduler

prepared = []
def _prepare_context_pair(self, req):
    prepared.append(req.py_request_id)
    return True
def schedule_request(self, active_requests, inflight_request_ids):
    # The real pass, reduced to what the gate meets: non-chunked, head of line.
    for req in active_requests:
        if not self._prepare_context_pair(req):
            break
    return SimpleNamespace(context_requests=[], generation_requests=[], recompute_paused_requests=[])
KVCacheV2Scheduler._prepare_context_pair = _prepare_context_pair
KVCacheV2Scheduler.schedule_request = schedule_request
original = vars(KVCacheV2Scheduler)["_prepare_context_pair"]

rec = Recorder()
binding = instrument(recorder=rec, engine=None)
BindingPort(binding).set_admission_policy(DeferDraft())
sched = object.__new__(KVCacheV2Scheduler)  # the stand-in constructor only has the signature
sched.kv_cache_manager = None
sched.draft_kv_cache_manager = None
def request(rid, prompt):
    return SimpleNamespace(py_request_id=rid, prompt_len=prompt, max_new_tokens=2, context_current_position=0,
                           is_first_context_chunk=True, py_draft_tokens=None, state=None)
active = [request(1, 10), request(2, 6)]
sched.schedule_request(active, set())
sched.schedule_request(active, set())
wrapped = vars(KVCacheV2Scheduler)["_prepare_context_pair"] is not original
uninstrument()
print(json.dumps({"prepared": prepared, "wrapped": wrapped,
                  "restored": vars(KVCacheV2Scheduler)["_prepare_context_pair"] is original,
                  "deferred": [[e.iteration, e.request_id, e.pool.value, e.num_blocks, e.reason]
                               for e in rec.drain() if e.kind.value == "admission_deferred"]}))
''')
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["prepared"] == []  # the original never ran for a refused attempt
    assert (result["wrapped"], result["restored"]) == (True, True)
    assert result["deferred"] == EXPECTED
