"""Which of the installed TensorRT-LLM's own classes a replay may run, checked before it starts.

``kvscope replay --scheduler installed`` runs the installed ``KVCacheV2Scheduler``
(``tensorrt_llm._torch.pyexecutor.scheduler.scheduler_v2``) in place of the engine model's;
``--manager installed`` runs the installed ``KVCacheManagerV2`` (``..kv_cache.kv_cache_manager_v2``,
or the 1.3.0rc25 path) for the target and draft pools. :func:`resolve` finds them, picks the seam
table their methods call for (:func:`kvscope.engines.trtllm.seams.choose_table`) and checks every
seam of that table on the classes it will run, plus the constructor parameters kvscope passes. A
build that fails any of it is refused with one line (:class:`InstalledRefused`, a ``ValueError``:
the CLI prints it and exits 2); nothing is half-swapped.

The manager runs on the GPU when a CUDA device answers. Without one it runs decisions-only: the
runtime's driver calls go to kvscope's accounting-only stand-in for ``cuda.bindings``
(``driver_standin/``), which this module puts first on ``sys.path`` before the manager is imported
(also when no ``cuda`` package is installed at all, so the manager module imports for the scheduler's
type check).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kvscope.engines.seams import check_seams
from kvscope.engines.trtllm.classes import (
    installed_seams_and_classes,
    installed_table_choice,
    installed_version,
)

PICKS: tuple[str, ...] = ("model", "installed")
"""Values of ``--scheduler`` and ``--manager``: the engine model's class, or the installed build's."""

DRIVER_STANDIN = Path(__file__).resolve().parent / "driver_standin"
"""Folder holding kvscope's accounting-only ``cuda`` package (decisions-only mode)."""

SCHEDULER_PARAMETERS: tuple[str, ...] = (
    "max_batch_size", "max_num_tokens", "kv_cache_manager", "scheduler_policy", "ctx_chunk_config",
    "peft_cache_manager", "draft_kv_cache_manager", "cross_kv_cache_manager",
    "enable_prefix_aware_scheduling", "enable_recompute_pause",
)
"""``KVCacheV2Scheduler.__init__`` parameters kvscope passes (read at 00746ef; the order of the first
four is positional there, as ``create_py_executor_instance`` calls it)."""

MANAGER_PARAMETERS: tuple[str, ...] = (
    "kv_cache_config", "kv_cache_type", "num_layers", "num_kv_heads", "head_dim", "tokens_per_block",
    "max_seq_len", "max_batch_size", "mapping", "dtype", "spec_config", "max_num_tokens", "is_draft",
    "num_reserved_index_slots", "joint_kv_cache_reuse",
)
"""``KVCacheManagerV2.__init__`` keyword arguments kvscope passes (the constructor's keywords as read at
0004396, ``kvscope/../shared/docs/trtllm-kv-v2.md`` section 2.1; ``joint_kv_cache_reuse`` is absent
before #18093, where kvscope leaves it out)."""


class InstalledRefused(ValueError):
    """The installed classes cannot run this replay; the message is one line saying why."""


@dataclass(frozen=True, slots=True)
class InstalledBuild:
    """The installed classes a replay will run (None: the model's), and how.

    Attributes:
        version: ``tensorrt_llm.__version__``.
        table: the seam table their methods call for (``SEAMS_BY_VERSION`` key).
        reason: why that table, in words.
        scheduler_cls: the installed ``KVCacheV2Scheduler``, or None.
        manager_cls: the installed ``KVCacheManagerV2``, or None.
        decisions_only: the manager runs on kvscope's accounting-only driver stand-in (no GPU).
    """

    version: str
    table: str
    reason: str
    scheduler_cls: type | None
    manager_cls: type | None
    decisions_only: bool

    def describe(self) -> dict[str, object]:
        """``kvscope replay --json`` key ``installed``."""
        def name(cls: type | None) -> str | None:
            return None if cls is None else f"{cls.__module__}.{cls.__qualname__}"

        return {"tensorrt_llm": self.version, "seam_table": self.table, "scheduler": name(self.scheduler_cls),
                "manager": name(self.manager_cls),
                "manager_mode": None if self.manager_cls is None else
                ("decisions-only" if self.decisions_only else "gpu")}


def has_cuda_device() -> bool:
    """Whether a CUDA device answers (``KVSCOPE_DECISIONS_ONLY=1`` says no whatever the machine has)."""
    if os.environ.get("KVSCOPE_DECISIONS_ONLY", "").strip() == "1":
        return False
    try:
        torch = importlib.import_module("torch")
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def use_driver_standin() -> None:
    """Put kvscope's accounting-only ``cuda`` package first on the import path (idempotent).

    Raises:
        InstalledRefused: the real ``cuda`` package is already imported in this process (the
            runtime would keep talking to it).
    """
    loaded = sys.modules.get("cuda")
    if loaded is not None and not str(getattr(loaded, "__file__", "") or "").startswith(str(DRIVER_STANDIN)):
        raise InstalledRefused("decisions-only mode needs kvscope's driver stand-in, but the real 'cuda' package "
                               "is already imported in this process")
    if str(DRIVER_STANDIN) not in sys.path:
        sys.path.insert(0, str(DRIVER_STANDIN))


def resolve(scheduler: str = "model", manager: str = "model", *, gpu: bool | None = None) -> InstalledBuild | None:
    """Check the installed classes for ``--scheduler`` / ``--manager``; None when both are ``model``.

    Args:
        scheduler: ``model`` or ``installed``.
        manager: ``model`` or ``installed``.
        gpu: whether a CUDA device is there (None: ask :func:`has_cuda_device`).

    Raises:
        InstalledRefused: a pick that cannot run, with the one-line reason: an unknown pick, the
            model's scheduler over the installed manager, tensorrt_llm not importable, or seams
            (or constructor parameters) the installed classes lack.
    """
    for flag, pick in (("--scheduler", scheduler), ("--manager", manager)):
        if pick not in PICKS:
            raise InstalledRefused(f"{flag} must be one of {', '.join(PICKS)}, got {pick!r}")
    want_scheduler, want_manager = scheduler == "installed", manager == "installed"
    if not (want_scheduler or want_manager):
        return None
    if want_manager and not want_scheduler:
        raise InstalledRefused("--manager installed needs --scheduler installed: the model's scheduler drives only "
                               "the model's manager")
    decisions_only = want_manager and not (has_cuda_device() if gpu is None else gpu)
    if decisions_only or _no_cuda_package():
        # Without a CUDA package the manager module does not even import; under the installed
        # scheduler alone its class serves only the scheduler's type check, so nothing reaches the
        # stand-in's accounting.
        use_driver_standin()
    flags = " ".join(f"--{k} installed" for k, on in (("scheduler", want_scheduler), ("manager", want_manager)) if on)
    version = installed_version()
    if version is None:
        why = _import_error("tensorrt_llm")
        raise InstalledRefused(f"{flags}: tensorrt_llm is not importable here ({why}); replay on the model "
                               "(--scheduler model --manager model)")
    choice = installed_table_choice()
    table, seams, classes = installed_seams_and_classes()
    wanted = {"KVCacheV2Scheduler"} if want_scheduler else set()
    if want_manager:
        wanted.add("KVCacheManagerV2")
    rows = [s for s in seams if s.class_name in wanted]
    lacking = [f"{m.seam.qualname} ({m.detail})" for m in check_seams(rows, classes=classes)]
    scheduler_cls = classes.get("KVCacheV2Scheduler") if want_scheduler else None
    manager_cls = classes.get("KVCacheManagerV2") if want_manager else None
    if not lacking:
        lacking += _constructor_gaps(scheduler_cls, "KVCacheV2Scheduler", SCHEDULER_PARAMETERS)
        optional = ("joint_kv_cache_reuse",) if table == "1.3.0rc25" else ()
        lacking += _constructor_gaps(manager_cls, "KVCacheManagerV2", MANAGER_PARAMETERS, optional)
    if lacking:
        raise InstalledRefused(f"{flags}: the installed TensorRT-LLM {version} (read as {table}: {choice.reason}) "
                               f"lacks seams kvscope records: {'; '.join(lacking)}")
    return InstalledBuild(version, table, choice.reason, scheduler_cls, manager_cls, decisions_only)


def _no_cuda_package() -> bool:
    try:
        return importlib.util.find_spec("cuda") is None
    except (ImportError, ValueError):
        return True


def _constructor_gaps(cls: type | None, name: str, passed: tuple[str, ...],
                      optional: tuple[str, ...] = ()) -> list[str]:
    """``Class.__init__ (no parameter x)`` for every parameter kvscope passes that ``cls`` does not take."""
    if cls is None:
        return []
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [f"{name}.__init__ (no parameter {p})" for p in passed if p not in params and p not in optional]


def _import_error(module: str) -> str:
    try:
        importlib.import_module(module)
    except Exception as e:  # any failure is the reason, in one line
        return f"{type(e).__name__}: {e}"
    return "imported, but has no __version__"
