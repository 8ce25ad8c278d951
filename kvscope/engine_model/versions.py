"""Engine builds the model can stand for: one frozen feature record per TensorRT-LLM version.

The reports ran released builds whose scheduler and KV cache manager are older than the newest main
the model was first written against. Behaviour that differs between them is looked up here by the
``engine_version`` knob; the model consults the record and never compares version strings.

Readings (``NVIDIA/TensorRT-LLM``; details and the inferences in ``SOURCES.md``, "Engine versions"):

- ``1.3.0rc25`` (GLM report, tag ``v1.3.0rc25`` = build commit 785c948): the stored
  ``scheduler/scheduler_v2.py`` of 46,253 characters and the stored
  ``pyexecutor/kv_cache_manager_v2.py`` (old path) of 140,614 characters. Neither carries joint
  reuse (#18093, merged 2026-08-29), ``admit_mirror`` or the ``[draft pool: ...]`` diagnostic;
  ``_prepare_draft_resources`` creates the mirror itself (born SUSPENDED), resumes it there (a
  refusal raises "Failed to resume draft KV cache for request N"), charges the draft tokens on every
  context chunk and names a missing generation mirror "Missing draft KV cache for generation request
  N". Its scheduler has no recompute pause, page preemption or prefix-aware skip, raises its deadlock
  error on the first pass that schedules nothing while generation waits, and checks the chunk unit
  before ``prepare_context`` like every main read (the 46k copy's opposite order is weighed and set
  aside in SOURCES.md, "rc25's chunked admission order": probable, not proven). The
  index lists no commit for them; reading the file at a commit finds the manager copy at 218ea16
  (the scheduler copy's is still unknown). Neither is tied to the tag: both are matched by
  features and by the report's facts (message without suffix, ``draft_mgr=`` log line, a build
  that crashed with block reuse on, i.e. without joint reuse).
- ``1.3.0rc27`` (hybrid report; commit not given): no stored copy can be tied to it. Taken as the
  0004396 reading (joint reuse present, manager under ``pyexecutor/kv_cache/``, draft tokens on the
  last chunk only, no scheduler-side mirror admission, no diagnostic suffix), because #18093 merged
  before rc25 shipped to the GLM reporter could not have been in rc25 but is in every main read
  after it, and ``admit_mirror`` / the diagnostic appear only on 00746ef.
- ``main-00746ef``: the newest code read (00746ef9992943a9bb604dbf1ecf00c64af58c32, probably a PR
  branch over 0004396720054fd8e205cbf616f21f0b57c6b412): ``admit_mirror`` and its callers,
  ``mirror_admission_certainly_blocked``, ``has_cache_tier_below_gpu``, the diagnostic suffix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class MissingGenMirror(str, Enum):
    """What ``_prepare_draft_resources`` does for a generation request with no draft mirror."""

    RAISE_MISSING = "raise_missing"
    """Older build: raise "Missing draft KV cache for generation request N" (no creation attempt)."""
    CREATE_OR_RAISE = "create_or_raise"
    """Newer builds: create the mirror on first sight; raise only when the IndexMapper is full."""


@dataclass(frozen=True, slots=True)
class EngineBuild:
    """The behaviour of one engine build that the model selects by version.

    Attributes:
        version: the ``engine_version`` knob value.
        build: the release tag / commit the build is (or "unknown").
        scheduler_source: the stored ``scheduler_v2.py`` the scheduler behaviour follows.
        kv_manager_source: the stored ``kv_cache_manager_v2.py`` the manager behaviour follows.
        kv_manager_module: import path of ``KVCacheManagerV2`` in that build.
        scheduler_admits_mirror: the scheduler creates and resumes the unpaired mirror at admission
            (``_admit_unpaired_draft`` -> ``admit_mirror``; ``_pending_ctx_certainly_blocked`` ->
            ``mirror_admission_certainly_blocked``). False: the mirror is born in
            ``_prepare_draft_resources`` and first resumed there.
        draft_pool_diagnostic: the two draft resize messages end with ``[draft pool: ...]``.
        draft_len_on_every_chunk: the mirror's context resize adds the draft tokens on every chunk
            (older build) instead of the last chunk only.
        joint_reuse: joint target/draft reuse (#18093) exists; ``draft_mode=paired`` is possible
            for manager classes that support the reuse backoff.
        missing_gen_mirror: what a generation request without a mirror meets.
        context_mirror_unchecked: a full draft IndexMapper on a context request is not checked (the
            ``None`` cache is used at once: ``AttributeError``), instead of warning and skipping.
        has_cache_tier_below_gpu: the manager has the ``has_cache_tier_below_gpu`` property and
            ``preempt_request``, and the scheduler's page-preemption fallback for a context request
            (``_try_preempt_for_pages``) that reads them.
        recompute_pause: the scheduler frees started requests entirely (``_try_recompute_pause_for_gen``)
            when suspension does not make room for a generation step.
        prefix_aware_skip: the scheduler defers a first chunk behind a request committing the same
            first new block (``probe_first_new_block_key``).
        free_failed_first_chunk: a first chunk that fails admission has its caches freed (and its
            reuse holds released) instead of staying suspended.
        chunk_unit_checked_after_prepare: the chunked context path skips a request before preparing it
            only when the token budget is spent, and checks the chunk unit after ``prepare_context``
            (the older order: a first chunk met with less than a chunk unit of budget has its target
            cache created, resumed and its reuse claimed first); newer builds check both first.
        context_pair_seams: the scheduler prepares and sizes a context attempt through its own
            ``_prepare_context_pair`` and ``_try_allocate_context``. False (rc25): it calls the
            target's ``prepare_context`` and ``resize_context`` directly, so those two seams are
            never called and kvscope sees the attempt at the manager and in the pass's output.
        deadlock_stall_passes: passes with no progress before the scheduler raises its deadlock
            error (1: the older check, which raises on the first pass that schedules nothing while
            generation requests wait and none was evicted, with the older message).
        history_over_capacity_text: what a resize whose capacity is below its history raises. The
            C++ core (``KvCache::resize``) says "History length cannot exceed capacity", the Python
            core (``_core/_kv_cache.py`` @ 00f6bd6) "History length cannot be greater than
            capacity". rc25: the C++ text, the one the #18661 report's rc25 traceback shows; the
            other builds keep the Python core's (which core a build runs by default was not read).
    """

    version: str
    build: str
    scheduler_source: str
    kv_manager_source: str
    kv_manager_module: str
    scheduler_admits_mirror: bool
    draft_pool_diagnostic: bool
    draft_len_on_every_chunk: bool
    joint_reuse: bool
    missing_gen_mirror: MissingGenMirror
    context_mirror_unchecked: bool
    has_cache_tier_below_gpu: bool
    recompute_pause: bool
    prefix_aware_skip: bool
    free_failed_first_chunk: bool
    chunk_unit_checked_after_prepare: bool
    deadlock_stall_passes: int
    context_pair_seams: bool
    history_over_capacity_text: str = "History length cannot be greater than capacity"
    inferred: tuple[tuple[str, str], ...] = ()
    """Fields not read at the build's own commit: (field, the evidence and its confidence). Every
    other field was read in the copy ``scheduler_source`` / ``kv_manager_source`` name. Printed by
    ``kvscope replay --describe-build``; the evidence in full is in SOURCES.md."""

    @property
    def label(self) -> str:
        return f"{self.version} ({self.build})"

    def features(self) -> list[tuple[str, object, str]]:
        """(field, value, provenance) for every behaviour field: ``read`` or ``inferred: why``."""
        why = dict(self.inferred)
        skip = {"version", "build", "scheduler_source", "kv_manager_source", "kv_manager_module", "inferred"}
        names = [n for n in self.__dataclass_fields__ if n not in skip]
        return [(n, getattr(self, n), f"inferred: {why[n]}" if n in why else "read") for n in names]


_OLD_MODULE = "tensorrt_llm._torch.pyexecutor.kv_cache_manager_v2"
_NEW_MODULE = "tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2"

RC25 = EngineBuild(
    version="1.3.0rc25", build="v1.3.0rc25 785c948",
    scheduler_source="scheduler/scheduler_v2.py, stored copy of 46,253 chars (commit inferred: rc25 era)",
    kv_manager_source="pyexecutor/kv_cache_manager_v2.py, stored copy of 140,614 chars (commit 218ea16; rc25 era "
                      "by features)",
    kv_manager_module=_OLD_MODULE, scheduler_admits_mirror=False, draft_pool_diagnostic=False,
    draft_len_on_every_chunk=True, joint_reuse=False, missing_gen_mirror=MissingGenMirror.RAISE_MISSING,
    context_mirror_unchecked=True, has_cache_tier_below_gpu=False, recompute_pause=False,
    prefix_aware_skip=False, free_failed_first_chunk=False, chunk_unit_checked_after_prepare=False,
    deadlock_stall_passes=1, context_pair_seams=False,
    history_over_capacity_text="History length cannot exceed capacity",
    inferred=tuple((field, why) for fields, why in (
        (("chunk_unit_checked_after_prepare",),
         "probable: main's order before and after (9ba713c, 00746ef); the 46k scheduler copy's opposite order "
         "is a closed PR's review diff and names what no merged file has (SOURCES.md, rc25's chunked admission "
         "order)"),
        (("scheduler_admits_mirror", "recompute_pause", "has_cache_tier_below_gpu", "prefix_aware_skip",
          "free_failed_first_chunk", "deadlock_stall_passes", "context_pair_seams"),
         "likely: read in the 46k scheduler copy, matched to rc25 by features and the report's log lines; its "
         "commit is unknown and the tag is not stored"),
        (("draft_pool_diagnostic", "draft_len_on_every_chunk", "missing_gen_mirror", "context_mirror_unchecked"),
         "likely: read in the manager copy at 218ea16 (before #17347, four days before main became rc25)"),
        (("joint_reuse",), "likely: #18093 merged after rc25 was cut, and the report's build crashed with reuse on"),
        (("history_over_capacity_text",), "read in the #18661 report's rc25 traceback, not in code"),
    ) for field in fields),
)
RC27 = EngineBuild(
    version="1.3.0rc27", build="v1.3.0rc27 (commit not given; read as 0004396)",
    scheduler_source="scheduler_v2.py as of 0004396 (inferred: 00746ef minus admit_mirror callers)",
    kv_manager_source="kv_cache/kv_cache_manager_v2.py @ 0004396720054fd8e205cbf616f21f0b57c6b412",
    kv_manager_module=_NEW_MODULE, scheduler_admits_mirror=False, draft_pool_diagnostic=False,
    draft_len_on_every_chunk=False, joint_reuse=True, missing_gen_mirror=MissingGenMirror.CREATE_OR_RAISE,
    context_mirror_unchecked=False, has_cache_tier_below_gpu=False, recompute_pause=True,
    prefix_aware_skip=True, free_failed_first_chunk=True, chunk_unit_checked_after_prepare=False,
    deadlock_stall_passes=1000, context_pair_seams=True,
    inferred=tuple((field, "no copy is tied to rc27; read as 0004396 (manager) and 00746ef without "
                           "admit_mirror's callers (scheduler), since #18093 is in every main after rc25")
                   for field in ("scheduler_admits_mirror", "draft_pool_diagnostic", "draft_len_on_every_chunk",
                                 "joint_reuse", "missing_gen_mirror", "context_mirror_unchecked",
                                 "has_cache_tier_below_gpu", "recompute_pause", "prefix_aware_skip",
                                 "free_failed_first_chunk", "chunk_unit_checked_after_prepare",
                                 "deadlock_stall_passes", "context_pair_seams", "history_over_capacity_text")),
)
MAIN_00746EF = EngineBuild(
    version="main-00746ef", build="00746ef9992943a9bb604dbf1ecf00c64af58c32",
    scheduler_source="scheduler/scheduler_v2.py @ 00746ef9992943a9bb604dbf1ecf00c64af58c32",
    kv_manager_source="kv_cache/kv_cache_manager_v2.py @ 00746ef9992943a9bb604dbf1ecf00c64af58c32",
    kv_manager_module=_NEW_MODULE, scheduler_admits_mirror=True, draft_pool_diagnostic=True,
    draft_len_on_every_chunk=False, joint_reuse=True, missing_gen_mirror=MissingGenMirror.CREATE_OR_RAISE,
    context_mirror_unchecked=False, has_cache_tier_below_gpu=True, recompute_pause=True,
    prefix_aware_skip=True, free_failed_first_chunk=True, chunk_unit_checked_after_prepare=False,
    deadlock_stall_passes=1000, context_pair_seams=True,
)

ENGINE_BUILDS: dict[str, EngineBuild] = {b.version: b for b in (RC25, RC27, MAIN_00746EF)}
NEWEST = MAIN_00746EF
ALIASES = {"main": NEWEST.version, "newest": NEWEST.version}


def get_engine_build(version: str) -> EngineBuild:
    """The build record for ``version`` (or an alias); ValueError lists the known versions."""
    name = ALIASES.get(version, version)
    try:
        return ENGINE_BUILDS[name]
    except KeyError:
        known = ", ".join([*ENGINE_BUILDS, *ALIASES])
        raise ValueError(f"unknown engine_version {version!r}; known: {known}") from None
