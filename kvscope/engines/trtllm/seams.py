"""The TensorRT-LLM methods kvscope wraps, keyed by engine version, each with the commit it was read at.

Every entry was read in ``NVIDIA/TensorRT-LLM`` at the commit it names (the signature facts are in
``snapshots/<version>.json``; tests check this record against them). Only Python adapter classes are
hooked: ``KVCacheManagerV2`` (and through inheritance ``DSACacheManagerV2``, which overrides none
of these methods), ``KVCacheV2Scheduler`` and ``ResourceManager`` (the executor's
``prepare_resources`` call site). The core ``_KVCache`` is never wrapped: a C++ backend can
replace it.

Versions:

* ``1.3.0rc25``: the build issue #18660 used. The manager lived at the older module path
  ``_torch/pyexecutor/kv_cache_manager_v2.py`` (read at 00be09f, a pre-#18093 version): no joint
  reuse, no ``prepare_context_cache`` / ``try_allocate_draft_context`` / ``_mirror_draft_kv_cache``,
  and ``_prepare_draft_resources`` charges the draft length on EVERY context chunk. The tag commit
  itself is inferred (the store holds no tags); see ``snapshots/1.3.0rc25.json``. Its scheduler (the
  stored rc25-era copy, commit not given) has ``schedule_request`` but no ``_try_allocate_context`` /
  ``_try_allocate_generation``: only the former is recorded. The binding sees an rc25 admission in
  the pass's output (the request's first scheduled chunk) and opens a first-chunk attempt's hold at
  the target's ``prepare_context``; a failed first chunk keeps its caches there, so its hold is
  reported, not dropped. Checked with ``../shared/tools/real-scheduler`` against the stored rc25
  ``scheduler_v2.py`` (sha256 9969784f...): glm5-dsa (reuse on and off), shared-prefix and near-miss
  replays give the same decisions and the same event files row for row as the engine model at rc25.
* ``main-0004396``: main after #18093 (joint reuse). Draft length only on the last chunk.
* ``1.3.0rc27``: the build of the hybrid report (commit not given). No copy tied to it is stored; it
  is read as main-0004396 (joint reuse present, the manager under ``kv_cache/``, no ``admit_mirror``),
  an inference recorded in ``kvscope/engine_model/SOURCES.md`` ("Engine versions").
* ``main-00746ef``: the newest code read; adds ``admit_mirror`` (the scheduler creates and resumes
  an unpaired mirror at admission) and the ``[draft pool: ...]`` suffix on the resize message.
  ``_util.py`` and ``py_executor.py`` are not stored at 00746ef: their rows keep the 0004396
  signatures and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engines.seams import PROPERTY, Seam

C_RC25_MGR = "00be09f78ecf0691f2b8e15dea518d1d6468679e"
C_0004396 = "0004396720054fd8e205cbf616f21f0b57c6b412"
C_00746EF = "00746ef9992943a9bb604dbf1ecf00c64af58c32"
C_DSA = "0bbb76d22e61bde633cc5f7733f5194881853501"

MGR_OLD = "tensorrt_llm._torch.pyexecutor.kv_cache_manager_v2"
MGR_NEW = "tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2"
SCHED = "tensorrt_llm._torch.pyexecutor.scheduler.scheduler_v2"
RES = "tensorrt_llm._torch.pyexecutor.resource_manager"
DSA = "tensorrt_llm._torch.attention_backend.sparse.dsa.cache_manager"
PYEXEC = "tensorrt_llm._torch.pyexecutor.py_executor"
UTIL = "tensorrt_llm._torch.pyexecutor._util"

_NOT_READ_RC25 = "not read at the rc25-era commit; signature from 0004396 (assumed unchanged)"
_SCHED_RC25 = ("signature read at 00746ef; the stored rc25-era scheduler_v2.py (46,253 characters, matched by "
               "features, commit not given: snapshots/1.3.0rc25.json 'stored_scheduler') has the same one")
# _util.py and py_executor.py are stored at 0004396 and older commits only, never at 00746ef.
_NOT_STORED_00746EF = "file not stored at 00746ef; signature read at 0004396"


def _schedule_request(commit: str, note: str = "") -> Seam:
    return Seam(SCHED, "KVCacheV2Scheduler.schedule_request", "(self, active_requests, inflight_request_ids)",
                commit, "iteration start, arrivals, chunks, ITERATION_SCHEDULED; deadlock raise -> ENGINE_FAILED", note)


def _scheduler(commit: str, note: str = "") -> tuple[Seam, ...]:
    return (
        _schedule_request(commit, note),
        Seam(SCHED, "KVCacheV2Scheduler._try_allocate_context", "(self, req, num_tokens)",
             commit, "ADMITTED on a first chunk's success, ADMISSION_DEFERRED (target) on failure", note),
        Seam(SCHED, "KVCacheV2Scheduler._try_allocate_generation", "(self, req)",
             commit, "read-only: generation growth is swept per iteration, failures come from the managers", note),
    )


def _pair_seam(note: str = "") -> Seam:
    return Seam(SCHED, "KVCacheV2Scheduler._prepare_context_pair", "(self, req)", C_00746EF,
                "unpaired mirror refused at admission -> RESUME_FAILED + ADMISSION_DEFERRED (draft)",
                (note + "; " if note else "") + "absent before #18093")


def _resource_manager() -> tuple[Seam, ...]:
    note = "ResourceManager bodies are the same in every stored version read"
    return (
        Seam(RES, "ResourceManager.prepare_resources", "(self, scheduled_batch)", C_0004396,
             "executor call site: POOL_SNAPSHOT per pool after; ENGINE_FAILED + REQUEST_FAILED on raise", note),
        Seam(RES, "ResourceManager.update_resources",
             "(self, scheduled_batch, attn_metadata=None, kv_cache_dtype_byte_size=None)", C_0004396,
             "ENGINE_FAILED on the generation-update raise", note),
        Seam(RES, "ResourceManager.free_resources", "(self, request)", C_0004396,
             "REQUEST_FINISHED / REQUEST_CANCELLED when the executor terminates a request", note),
    )


def _executor(note: str = "") -> tuple[Seam, ...]:
    return (
        Seam(PYEXEC, "PyExecutor._handle_errors",
             "(self, error_msg=None, *, requests=None, charge_budget=True, fatal_is_collective_aligned=False)",
             C_0004396, "REQUEST_FAILED (the error) for the requests it ends; remediation's per-request error path",
             note),
        Seam(PYEXEC, "PyExecutor._prepare_and_schedule_batch", "(self)", C_0004396,
             "nothing recorded: the binding learns its executor here (the first call, before any scheduling "
             "pass), so rejection and containment end one request through _handle_errors", note),
    )


def _budget_split(note: str = "") -> tuple[Seam, ...]:
    return (
        Seam(UTIL, "KvCacheCreator._split_kv_cache_budget_for_draft",
             "(self, budget_attr, target_kv_cache_config=None, draft_kv_cache_config=None)", C_0004396,
             "POOL_SIZED (split before/after) when a sizing plan is given (KVSCOPE_SIZING); stock otherwise",
             (note + "; " if note else "") + "same signature in the other stored _util.py (d8ae02c)"),
        Seam(UTIL, "KvCacheCreator._get_target_and_draft_cache_costs", "(self, kv_cache_config=None)", C_0004396,
             "read-only: called (never wrapped) by the sizing plan to re-split with the stock affine costs; "
             "the engine model's split (engine_model/config.py) follows the same costs",
             (note + "; " if note else "") + "None when a cost is negative or zero in both slope and intercept"),
    )


def _manager_common(module: str, commit: str, *, late_note: str = "", late_commit: str = C_0004396) -> tuple[Seam, ...]:
    m = "KVCacheManagerV2."
    return (
        Seam(module, m + "_prepare_draft_resources", "(self, scheduled_batch)", commit,
             "draft mirror BLOCKS_ALLOCATED / RESIZED / RESUMED; RESIZE_FAILED / RESUME_FAILED before the raise"),
        Seam(module, m + "prepare_context", "(self, req)", commit,
             "BLOCKS_REUSED (prefix hit) on a new cache; the admission gate where the scheduler has no "
             "_prepare_context_pair (rc25: its stored scheduler_v2.py calls the target's prepare_context "
             "once per context attempt; False skips/stops, never preempts)"),
        Seam(module, m + "resize_context", "(self, req, num_tokens)", commit,
             "BLOCKS_ALLOCATED on growth, RESIZE_FAILED (asked capacity) on failure"),
        Seam(module, m + "try_allocate_generation", "(self, req)", commit,
             "generation growth BLOCKS_ALLOCATED, RESUMED, RESIZE_FAILED"),
        Seam(module, m + "revert_allocate_context", "(self, req)", commit, "RESIZED (shrink) or BLOCKS_FREED"),
        Seam(module, m + "suspend_request", "(self, req)", commit, "SUSPENDED"),
        Seam(module, m + "resume_request", "(self, req)", commit, "RESUMED / RESUME_FAILED"),
        Seam(module, m + "update_context_resources", "(self, scheduled_batch)", late_commit,
             "BLOCKS_COMMITTED (committed tokens grew)", late_note),
        Seam(module, m + "update_resources",
             "(self, scheduled_batch, attn_metadata=None, kv_cache_dtype_byte_size=None)", late_commit,
             "read-only: the draft-slot give-back changes capacity, rarely blocks (POOL_SNAPSHOT shows it);"
             " a raise here is reported at ResourceManager.update_resources", late_note),
        Seam(module, m + "free_resources", "(self, request, pin_on_release=False)", late_commit,
             "BLOCKS_FREED", late_note),
    )


def _manager_main(commit: str, *, late_note: str = "", late_commit: str = C_0004396) -> tuple[Seam, ...]:
    m = "KVCacheManagerV2."
    return _manager_common(MGR_NEW, commit, late_note=late_note, late_commit=late_commit) + (
        Seam(MGR_NEW, m + "prepare_context_cache", "(self, req, reuse_limit=None)", commit,
             "BLOCKS_REUSED for paired draft caches (the target goes through prepare_context)",
             "absent before #18093"),
        Seam(MGR_NEW, m + "try_allocate_draft_context", "(self, req, num_tokens)", commit,
             "paired draft BLOCKS_ALLOCATED / RESIZE_FAILED at admission", "absent before #18093"),
    )


SEAMS_BY_VERSION: dict[str, tuple[Seam, ...]] = {
    # The rc25 scheduler has no _try_allocate_context / _try_allocate_generation (its context and
    # generation paths call the manager seams directly), so only schedule_request is recorded.
    "1.3.0rc25": _manager_common(MGR_OLD, C_RC25_MGR, late_note=_NOT_READ_RC25)
    + (_schedule_request(C_00746EF, _SCHED_RC25),)
    + _resource_manager()
    + _executor(_NOT_READ_RC25),
    # No budget-split row: no _util.py of the rc25 era is stored (only 0004396 and d8ae02c), so whether
    # rc25 splits the budget through this method is not known; the sizing hook is not offered there.
    "1.3.0rc27": _manager_main(C_0004396) + _scheduler(C_00746EF, "scheduler read at 00746ef only")
    + (_pair_seam("scheduler read at 00746ef only"),)
    + _resource_manager()
    + _executor()
    + _budget_split(),
    "main-0004396": _manager_main(C_0004396) + _scheduler(C_00746EF, "scheduler read at 00746ef only")
    + (_pair_seam("scheduler read at 00746ef only"),)
    + _resource_manager()
    + _executor()
    + _budget_split(),
    "main-00746ef": _manager_main(C_00746EF, late_commit=C_00746EF)
    + (
        Seam(MGR_NEW, "KVCacheManagerV2.admit_mirror", "(self, req)", C_00746EF,
             "RESUMED when it resumes a suspended mirror at scheduling time (a new one: its first pages at "
             "the draft sweep); its refusal is observed at KVCacheV2Scheduler._prepare_context_pair", "only on 00746ef"),
        Seam(MGR_NEW, "KVCacheManagerV2.has_cache_tier_below_gpu", PROPERTY, C_00746EF,
             "read only (pool configuration)", "only on 00746ef"),
    )
    + _scheduler(C_00746EF)
    + (_pair_seam(),)
    + _resource_manager()
    + _executor(_NOT_STORED_00746EF)
    + _budget_split(_NOT_STORED_00746EF),
}
"""Seam tables by engine version. ``main-00746ef`` is what the engine model follows."""


MODEL_VERSION = "main-00746ef"
"""The version whose seams the CPU engine model reproduces (and is checked against)."""

DIFFERENCES: tuple[str, ...] = (
    "1.3.0rc25: KVCacheManagerV2 lives in tensorrt_llm._torch.pyexecutor.kv_cache_manager_v2; "
    "main moved it to tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2 before #18093 "
    "(stored 1fe0b08 and 63a36e8: a manager without joint reuse at the new path), so the path never "
    "picks the table and the class is taken from whichever path has it.",
    "1.3.0rc25: _prepare_draft_resources charges the draft length on every context chunk; "
    "main (after #18093) only on the last chunk.",
    "1.3.0rc25: no joint reuse; prepare_context_cache, try_allocate_draft_context and "
    "_mirror_draft_kv_cache do not exist (the mirror is created inline, without prefix match).",
    "1.3.0rc25: revert_allocate_context returns None; main returns bool (False: cache dropped).",
    "1.3.0rc25: KVCacheV2Scheduler has no _try_allocate_context, _try_allocate_generation or "
    "_prepare_context_pair; _try_schedule_context_* and _try_schedule_generation call the manager's "
    "prepare_context / resize_context / try_allocate_generation directly.",
    "At 00746ef, not at 0004396: admit_mirror, has_active_cache, mirror_admission_certainly_blocked, "
    "preempt_request, has_cache_tier_below_gpu, _draft_pool_diagnostic (resize message suffix "
    "'[draft pool: N live caches holding T tokens, gpu_max_tokens=G]'); the scheduler's "
    "_admit_unpaired_draft creates and resumes the mirror at admission but still does not size it. "
    "They did not land together: stored 94a19f7, 88e0cf6 and 7fee7ea have preempt_request and "
    "has_cache_tier_below_gpu without admit_mirror, 94a19f7 and 12a71fe the suffix without it. Such "
    "builds take the 1.3.0rc27 table (its seams match them); the engine model's rc27 build has "
    "neither page preemption nor the suffix, so it models them only where those are not in play.",
)

MANAGER_MODULES: tuple[str, ...] = (MGR_NEW, MGR_OLD)
"""Where to look for KVCacheManagerV2, newest path first."""


def version_for_module(module: str) -> str:
    """The seam table a module path alone suggests (kept for callers that only know the path; the
    table is chosen by :func:`choose_table`, which looks at the methods)."""
    return "1.3.0rc25" if module == MGR_OLD else "main-00746ef"


@dataclass(frozen=True, slots=True)
class TableChoice:
    """Which seam table an engine's classes call for, and the evidence, in words."""

    table: str
    reason: str


# Each entry: (table, manager methods that must all exist). The first match wins; builds that share
# a module path differ in these methods, so the path is never the evidence.
_FEATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("main-00746ef", ("admit_mirror", "has_cache_tier_below_gpu")),
    ("1.3.0rc27", ("prepare_context_cache", "try_allocate_draft_context")),
)


def choose_table(manager_cls: type | None, *, module: str | None = None) -> TableChoice:
    """The seam table for a ``KVCacheManagerV2`` class, chosen by the methods it has.

    ``admit_mirror`` + ``has_cache_tier_below_gpu``: the scheduler admits unpaired mirrors
    (main-00746ef). Joint-reuse methods (``prepare_context_cache``, ``try_allocate_draft_context``)
    without them: #18093 is in, scheduler-side mirror admission is not (1.3.0rc27, read as 0004396).
    Neither: no joint reuse (1.3.0rc25). ``module`` only enters the explanation.
    """
    where = f" (found in {module})" if module else ""
    if manager_cls is None:
        return TableChoice("main-00746ef", "KVCacheManagerV2 not found; assuming the newest table read")
    for table, methods in _FEATURES:
        if all(hasattr(manager_cls, name) for name in methods):
            return TableChoice(table, f"{manager_cls.__name__}{where} has {' and '.join(methods)}")
    missing = ", ".join(name for _, methods in _FEATURES for name in methods if not hasattr(manager_cls, name))
    return TableChoice("1.3.0rc25", f"{manager_cls.__name__}{where} has none of {missing} (no joint reuse)")


def seams_for(version: str) -> tuple[Seam, ...]:
    try:
        return SEAMS_BY_VERSION[version]
    except KeyError:
        raise ValueError(f"unknown engine version {version!r}; known: {', '.join(SEAMS_BY_VERSION)}") from None
