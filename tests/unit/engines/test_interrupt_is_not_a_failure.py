"""An interrupt leaving an engine call is not the engine's failure, in every hook family.

Each hook that reports a fatal raise (the executor's resource-manager calls, the scheduling pass,
the KV manager's batch calls) is built around an engine method that raises as it is called: an
interrupt (Ctrl-C, SIGTERM, SystemExit, GeneratorExit) passes through unchanged and records no
ENGINE_FAILED and no REQUEST_FAILED, the request stays pending; the engine's own exception is
still its failure (the control).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engines.hooks import HOOKS
from kvscope.engines.instrumentor import instrument
from kvscope.events import EventKind, PoolRole
from kvscope.recording import Recorder
from kvscope.recording.interrupts import Terminated
from kvscope.workloads.workload import WorkloadRequest

INTERRUPTS = [KeyboardInterrupt, Terminated, SystemExit, GeneratorExit]
FAILURE_KINDS = (EventKind.ENGINE_FAILED, EventKind.REQUEST_FAILED)


def _running(make_engine):
    """A small engine with request 1 admitted and generating, instrumented."""
    engine = make_engine()
    rec = Recorder(clock=engine.clock.now_ns, clock_name="simulated", capacity=1 << 12)
    binding = instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 8, (11, 12)))
    engine.step()
    assert binding.requests.pending == {1}
    rec.drain()
    return engine, rec, binding


def _raising(exc: BaseException) -> Callable[..., Any]:
    def original(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise exc

    return original


# hook family, HOOKS key, the object the method is called on, its arguments
CALLS = [
    ("executor", "ResourceManager.prepare_resources", lambda e: (e.resource_manager, (_batch(e),))),
    ("executor", "ResourceManager.update_resources", lambda e: (e.resource_manager, (_batch(e), None, None))),
    ("scheduler", "KVCacheV2Scheduler.schedule_request",
     lambda e: (e.scheduler, (e.active_requests, e.inflight_request_ids))),
    ("manager", "KVCacheManagerV2.update_context_resources",
     lambda e: (e.scheduler.kv_cache_manager, (_batch(e),))),
    ("manager", "KVCacheManagerV2._prepare_draft_resources",
     lambda e: (e.scheduler.draft_kv_cache_manager, (_batch(e),))),
]


def _batch(engine) -> ScheduledRequestsModel:
    return ScheduledRequestsModel(generation_requests=list(engine.active_requests))


@pytest.mark.parametrize("exc_type", INTERRUPTS, ids=lambda t: t.__name__)
@pytest.mark.parametrize("family,key,call", CALLS, ids=[c[1] for c in CALLS])
def test_an_interrupt_leaving_an_engine_call_records_no_failure_in_any_hook_family(make_engine, family, key, call,
                                                                                  exc_type):
    engine, rec, binding = _running(make_engine)
    exc = exc_type()
    method = HOOKS[key](binding, _raising(exc))
    obj, args = call(engine)
    with pytest.raises(exc_type) as info:
        method(obj, *args)
    assert info.value is exc  # passed on unchanged
    rows = rec.drain()
    assert [e.kind for e in rows if e.kind in FAILURE_KINDS] == []
    assert binding.requests.pending == {1}  # its outcome is unknown, not failed
    assert binding.raising_pool is PoolRole.NONE
    assert binding.hook_errors == 0


@pytest.mark.parametrize("family,key,call", CALLS, ids=[c[1] for c in CALLS])
def test_the_engines_own_exception_is_still_its_failure_in_every_hook_family(make_engine, family, key, call):
    engine, rec, binding = _running(make_engine)
    method = HOOKS[key](binding, _raising(RuntimeError("request 1: boom")))
    obj, args = call(engine)
    with pytest.raises(RuntimeError):
        method(obj, *args)
    rows = [(e.kind, e.request_id) for e in rec.drain() if e.kind in FAILURE_KINDS]
    if family == "manager" and key.endswith("_prepare_draft_resources"):
        # Its raise is reported by the executor-side hook it leaves through (prepare_resources).
        assert rows == []
        return
    assert rows == [(EventKind.ENGINE_FAILED, 1), (EventKind.REQUEST_FAILED, 1)]
    assert binding.requests.pending == set()

