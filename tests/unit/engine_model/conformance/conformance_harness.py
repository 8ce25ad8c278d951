"""Small engines and requests for the conformance tests (upstream's CPU mock tests, re-expressed).

Upstream drives ``KVCacheV2Scheduler`` with mocked managers whose answers are scripted ("the second
allocation fails"). Here the managers are the model's own, so every answer comes from real pool
arithmetic: each scenario sizes its pools so that exactly the allocation upstream scripts to fail
runs out of blocks. With ``TPB`` tokens per block, a request built by ``gen`` holds whole blocks, so
its next decode step needs exactly one new block (plus one per ``TPB`` draft tokens).

Suspension only frees GPU pages when a tier below the GPU exists (pages move to the host), so the
scenarios where upstream's mock lets a retry succeed after an eviction use ``host_blocks``; without a
host tier a suspension frees nothing, which is what upstream's "eviction insufficient" scripts.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.request import LlmRequestModel, LlmRequestState
from kvscope.engine_model.scheduler import ContextChunkingPolicy, KVCacheV2SchedulerModel
from kvscope.engine_model.versions import ENGINE_BUILDS, EngineBuild
from kvscope.engine_model.versions import NEWEST as NEWEST_BUILD

TPB = 4
FCFS = ContextChunkingPolicy.FIRST_COME_FIRST_SERVED
FORCE = ContextChunkingPolicy.FORCE_CHUNK

SCHEDULER_TESTS = """Upstream file: ``tests/unittest/_torch/executor/kv_cache/test_kv_cache_v2_scheduler.py`` of
NVIDIA/TensorRT-LLM @ 00746ef9992943a9bb604dbf1ecf00c64af58c32 (the commit the model's scheduler
follows). Each test here is named after the upstream test (same class, same name) and keeps its
decisions exact: which requests are scheduled, paused, recompute-paused, in which order, and which
manager calls were made. Where upstream scripts a manager answer ("the second allocation fails"),
the pools are sized so the model's own arithmetic gives that answer; the numbers chosen are in each
docstring. Upstream tests of features the model does not claim (encoder/cross KV, disaggregated
serving, PEFT/LoRA pages, beam width, multimodal chunk alignment, KV connector, async transfer
manager) are listed in ``kvscope/engine_model/SOURCES.md`` with the reason.
"""
"""What the ``test_conformance_scheduler_*`` files follow, and how (one copy, named in each file)."""

# The engine versions the model claims (versions.py); tests taking ``version`` run once per build.
ENGINE_VERSIONS: dict[str, EngineBuild] = dict(ENGINE_BUILDS)
NEWEST = NEWEST_BUILD.version


@dataclass
class Engine:
    """One scheduler with its target manager and optional draft manager."""

    scheduler: KVCacheV2SchedulerModel
    target: KVCacheManagerV2Model
    draft: KVCacheManagerV2Model | None
    version: str

    @property
    def managers(self) -> list[KVCacheManagerV2Model]:
        return [m for m in (self.target, self.draft) if m is not None]

    @property
    def paired(self) -> bool:
        return self.target.enable_joint_kv_cache_reuse and self.draft is not None

    def schedule(self, requests, inflight=()):
        return self.scheduler.schedule_request(list(requests), set(inflight))

    def free(self, pool: str = "target") -> int:
        return getattr(self, pool).pool_state().free_blocks


def build(*, target_blocks: int = 256, draft_blocks: int | None = None, paired: bool = False,
          reuse: bool = False, host_blocks: int = 0, draft_host_blocks: int | None = None,
          max_batch_size: int = 100, max_num_tokens: int | None = 1024,
          chunk: int | tuple[ContextChunkingPolicy, int] | None = None, prefix_aware: bool = True,
          recompute_pause: bool = True, max_draft_len: int = 0, scheduler_capacity: int | None = None,
          tpb: int = TPB, version: str = NEWEST, max_util_for_resume: float = 0.95) -> Engine:
    """A target pool (and a draft pool when ``draft_blocks`` is given) behind one scheduler.

    Defaults follow upstream's ``make_scheduler`` / ``make_kv_cache_manager``: batch 100, budget
    1024 tokens, block reuse off, not chunked, prefix-aware scheduling and recompute pause on.
    """
    assert not paired or ENGINE_VERSIONS[version].joint_reuse, f"{version} has no joint reuse"
    common = dict(tokens_per_block=tpb, max_seq_len=1 << 20, max_batch_size=max_batch_size,
                  max_num_tokens=max_num_tokens or 8192, max_draft_len=max_draft_len,
                  enable_block_reuse=reuse, joint_kv_cache_reuse=paired,
                  max_util_for_resume=max_util_for_resume, engine_build=ENGINE_VERSIONS[version])
    target = KVCacheManagerV2Model(num_blocks=target_blocks, num_host_blocks=host_blocks, **common)
    draft = None
    if draft_blocks is not None:
        draft = KVCacheManagerV2Model(
            num_blocks=draft_blocks, is_draft=True,
            num_host_blocks=host_blocks if draft_host_blocks is None else draft_host_blocks, **common)
    if isinstance(chunk, int):
        chunk = (FCFS, chunk)
    scheduler = KVCacheV2SchedulerModel(
        max_batch_size, max_num_tokens, target, draft_kv_cache_manager=draft, ctx_chunk_config=chunk,
        scheduler_capacity=scheduler_capacity, enable_prefix_aware_scheduling=prefix_aware,
        enable_recompute_pause=recompute_pause)
    return Engine(scheduler, target, draft, version)


def _keys(rid: int, prompt_len: int, tpb: int, shared: list[int] | None = None) -> list[int]:
    own = [1_000_000 * (rid + 1) + k for k in range(prompt_len // tpb)]
    if shared:
        own[: len(shared)] = shared
    return own


def ctx(engine: Engine, rid: int, prompt_len: int, *, drafts: int = 0, lora: int | None = None,
        done: int = 0, shared_keys: list[int] | None = None) -> LlmRequestModel:
    """A context request. ``done`` > 0: a started request (non-first chunk) that already holds the
    caches of its first ``done`` prompt tokens in every pool, as after one scheduled chunk."""
    tpb = engine.target.tokens_per_block
    req = LlmRequestModel(rid, prompt_len, 1000, _keys(rid, prompt_len, tpb, shared_keys),
                          max_draft_len=drafts, lora_task_id=lora)
    req.py_draft_tokens = [0] * drafts
    if done:
        _hold(engine, req, done)
        req.context_chunk_size = done
        req.move_to_next_context_chunk()
    return req


def gen(engine: Engine, rid: int, tokens: int = 2 * TPB, *, drafts: int = 0,
        lora: int | None = None) -> LlmRequestModel:
    """A request in generation holding ``tokens`` KV tokens (whole blocks) in every pool."""
    req = LlmRequestModel(rid, tokens, 1000, _keys(rid, tokens, engine.target.tokens_per_block),
                          max_draft_len=drafts, lora_task_id=lora)
    _hold(engine, req, tokens)
    req.context_chunk_size = tokens
    req.move_to_next_context_chunk()
    req.state = LlmRequestState.GENERATION_IN_PROGRESS
    req.num_generated_tokens = 1
    req.py_draft_tokens = [0] * drafts
    return req


def _hold(engine: Engine, req: LlmRequestModel, tokens: int) -> None:
    """Give ``req`` caches of ``tokens`` tokens in the target and (as the executor would have) in the
    draft pool: created, resumed and sized, the way an earlier iteration left them."""
    assert engine.target.prepare_context(req) and engine.target.resize_context(req, tokens)
    draft = engine.draft
    if draft is None:
        return
    if engine.paired:
        assert draft.prepare_context(req) and draft.try_allocate_draft_context(req, tokens)
    else:
        mirror = draft._mirror_draft_kv_cache(req)
        assert mirror is not None and mirror.resume() and mirror.resize(tokens)


def ids(requests) -> list[int]:
    return [r.request_id for r in requests]


def suspended(engine: Engine, req: LlmRequestModel) -> LlmRequestModel:
    """Suspend ``req``'s caches in every pool (an earlier iteration evicted it)."""
    for manager in engine.managers:
        manager.suspend_request(req)
    return req


def finish_iteration(engine: Engine, out) -> None:
    """What the executor does with one schedule before the next, in its order (only the parts the
    scheduler reads): recompute-paused requests are freed and reset, the draft pool is prepared,
    scheduled chunks advance and commit their full blocks, finished prompts turn to generation."""
    for req in out.recompute_paused_requests:
        for manager in reversed(engine.managers):
            manager.free_resources(req)
        req.reset_for_recompute()
    batch = ScheduledRequestsModel(out.context_requests, out.generation_requests, out.paused_requests)
    if engine.draft is not None:
        engine.draft.prepare_resources(batch)
    for req in out.context_requests:
        req.move_to_next_context_chunk()
    for manager in engine.managers:
        manager.update_context_resources(batch)
    for req in out.context_requests:
        if req.context_remaining_length == 0:
            req.state, req.num_generated_tokens = LlmRequestState.GENERATION_IN_PROGRESS, 1


def occupy(manager: KVCacheManagerV2Model, num_blocks: int):
    """Hold ``num_blocks`` GPU blocks of ``manager``'s pool with a cache no request owns (another
    rank's or an in-flight request's pages, as far as the scheduler can tell). ``close()`` frees."""
    cache = manager.impl.create_kv_cache(None, None, id=-1)
    assert cache.resume() and cache.resize(num_blocks * manager.tokens_per_block)
    return cache


def spy(obj, name: str) -> list[tuple]:
    """Record the arguments of every call to ``obj.name`` (the real method still runs)."""
    calls: list[tuple] = []
    real = getattr(obj, name)

    def recorded(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    setattr(obj, name, recorded)
    return calls


def cache_prefix(manager: KVCacheManagerV2Model, keys: list[int]) -> None:
    """Leave ``keys`` committed and unreferenced in ``manager``'s radix tree, as a finished request
    with that prompt leaves them under block reuse."""
    tpb = manager.tokens_per_block
    cache = manager.impl.create_kv_cache(None, None, id=-2)
    assert cache.resume() and cache.resize(len(keys) * tpb)
    cache.commit(len(keys) * tpb, keys)
    cache.close()
