"""Instrumentor: wrap an engine's seam methods with the hooks, reversibly and idempotently.

Usage::

    from kvscope.engines.instrumentor import instrument, uninstrument
    binding = instrument(recorder=rec, engine="model")      # or "tensorrt_llm", or an engine object
    ...                                                       # run the engine
    uninstrument()                                            # the original functions are back

* Before patching, the seam record for the engine is checked against the classes found
  (:func:`kvscope.engines.seams.seam_results`); a seam whose class or method is missing or whose
  parameters changed is NOT wrapped, and a warning names it in plain words.
* Wrapping is class-level (``setattr(owner, name, factory(binding, original))`` on the class that
  defines the method, with the factory from :data:`kvscope.engines.hooks.HOOKS`), so every
  instance, including ones built later and subclasses such as ``DSACacheManagerV2``, is observed.
  ``uninstrument`` puts the very same function objects back (``Class.method is original``).
* ``instrument`` twice is a no-op with a warning and returns the active binding.
* Handing an engine object (``PyExecutor`` / ``PyExecutorModel`` / a scheduler / a resource manager)
  also registers its KV managers at once, so POOL_CONFIGURED is recorded before anything else and
  ``binding.pool_meta`` is ready for the event file header.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Callable
from typing import Any

from kvscope.engines.binding import Binding
from kvscope.engines.hooks import HOOKS, MODEL_ONLY, HookFactory
from kvscope.engines.pools import PoolReader
from kvscope.engines.seams import Seam, SeamResult, seam_results
from kvscope.recording import Recorder

log = logging.getLogger(__name__)

ENGINE_MODEL = "engine_model"
TENSORRT_LLM = "tensorrt_llm"
_ALIASES = {"model": ENGINE_MODEL, "engine_model": ENGINE_MODEL, "tensorrt_llm": TENSORRT_LLM,
            "trtllm": TENSORRT_LLM}


class Instrumentor:
    """Patches one engine's classes. One instance per engine kind (see :func:`instrument`)."""

    def __init__(self, kind: str) -> None:
        if kind not in (ENGINE_MODEL, TENSORRT_LLM):
            raise ValueError(f"engine must be '{ENGINE_MODEL}' or '{TENSORRT_LLM}', got {kind!r}")
        self.kind = kind
        self.binding: Binding | None = None
        self.results: list[SeamResult] = []
        self.version = ""
        self._patches: list[tuple[type, str, Any]] = []

    @property
    def is_instrumented(self) -> bool:
        return self.binding is not None

    @property
    def patched(self) -> list[tuple[type, str, Any]]:
        """``(owner class, method name, original)`` for every wrapped method."""
        return list(self._patches)

    def instrument(self, recorder: Recorder, *,
                   device_memory: Callable[[], dict[str, int] | None] | None = None) -> Binding:
        if self.binding is not None:
            warnings.warn(f"kvscope: {self.kind} is already instrumented; instrument() ignored",
                          RuntimeWarning, stacklevel=3)
            return self.binding
        seams, classes, reader, extras = self._resolve()
        binding = Binding(recorder, reader, device_memory)
        self.results = seam_results(seams, classes=classes)
        done: set[tuple[type, str]] = set()
        try:
            for result in self.results:
                seam = result.seam
                factory = HOOKS.get(seam.qualname)
                if factory is None:
                    continue  # read-only seam
                if result.mismatch is not None:
                    warnings.warn(f"kvscope: not wrapping {result.mismatch}", RuntimeWarning, stacklevel=3)
                    continue
                self._patch(classes[seam.class_name], seam.method_name, factory, binding, done)
            for cls, qualname in extras:
                name = qualname.split(".", 1)[1]
                if hasattr(cls, name):
                    self._patch(cls, name, HOOKS[qualname], binding, done)
        except BaseException:
            self._restore()
            raise
        self.binding = binding
        return binding

    def uninstrument(self) -> None:
        """Put every original function back. Safe to call when not instrumented."""
        self._restore()
        self.binding = None

    # ---- internals ----------------------------------------------------------------------------
    def _patch(self, cls: type, name: str, factory: HookFactory, binding: Binding,
               done: set[tuple[type, str]]) -> None:
        """Replace ``name`` on the class of ``cls``'s MRO that defines it (once per owner)."""
        owner = next(k for k in cls.__mro__ if name in vars(k))
        if (owner, name) in done:
            return
        original = vars(owner)[name]
        setattr(owner, name, factory(binding, original))
        self._patches.append((owner, name, original))
        done.add((owner, name))

    def _restore(self) -> None:
        while self._patches:
            owner, name, original = self._patches.pop()
            setattr(owner, name, original)

    def _resolve(self) -> tuple[tuple[Seam, ...], dict[str, type | None], PoolReader, list]:
        if self.kind == ENGINE_MODEL:
            from kvscope.engines.model.seams import (
                model_classes,
                model_executor_class,
                model_seams,
                runs_installed_manager,
            )
            from kvscope.engines.model.state import ModelPoolReader
            from kvscope.engines.trtllm.seams import MODEL_VERSION, seams_for
            from kvscope.engines.trtllm.state import TrtllmPoolReader

            self.version = MODEL_VERSION
            executor = model_executor_class()
            extras = [(executor, qualname) for qualname in MODEL_ONLY]
            # Installed KV managers (kvscope replay --manager installed) are read as TensorRT-LLM's.
            reader: PoolReader = TrtllmPoolReader() if runs_installed_manager() else ModelPoolReader()
            return model_seams(seams_for(MODEL_VERSION)), dict(model_classes()), reader, extras
        from kvscope.engines.trtllm.classes import installed_seams_and_classes
        from kvscope.engines.trtllm.state import TrtllmPoolReader

        self.version, seams, classes = installed_seams_and_classes()
        return seams, classes, TrtllmPoolReader(), []


_INSTRUMENTORS: dict[str, Instrumentor] = {}


def _kind_of(engine: Any) -> str:
    if engine is None:
        return TENSORRT_LLM if importlib.util.find_spec("tensorrt_llm") is not None else ENGINE_MODEL
    if isinstance(engine, str):
        try:
            return _ALIASES[engine]
        except KeyError:
            raise ValueError(f"engine must be one of {sorted(_ALIASES)} or an engine object, got {engine!r}") from None
    module = type(engine).__module__
    return ENGINE_MODEL if module.startswith("kvscope.engine_model") else TENSORRT_LLM


def managers_of(engine: Any) -> list[Any]:
    """The KV managers reachable from an engine object (executor, scheduler or resource manager)."""
    found: list[Any] = []
    candidates: list[Any] = []
    rm = getattr(engine, "resource_manager", None) or engine
    candidates.extend(getattr(rm, "resource_managers", {}).values() if hasattr(rm, "resource_managers") else ())
    scheduler = getattr(engine, "scheduler", None) or engine
    for attr in ("kv_cache_manager", "draft_kv_cache_manager"):
        candidates.append(getattr(scheduler, attr, None))
    for m in candidates:
        if m is not None and hasattr(m, "kv_cache_map") and all(m is not f for f in found):
            found.append(m)
    # Target first, then draft: POOL_CONFIGURED order does not depend on the executor's order.
    found.sort(key=lambda m: bool(getattr(m, "is_draft", False)))
    # A hybrid target's mamba state pool is reported as a third pool (role MAMBA), after the two.
    for m in list(found):
        if getattr(m, "mamba_state_pool", None) is not None:
            from kvscope.engines.model.state import mamba_pool_view

            found.append(mamba_pool_view(m))
    return found


def instrument(*, recorder: Recorder, engine: Any = None,
               device_memory: Callable[[], dict[str, int] | None] | None = None) -> Binding:
    """Instrument ``engine`` ("model", "tensorrt_llm", an engine object, or None: TensorRT-LLM when
    importable, else the model) so its KV facts go to ``recorder``. Returns the binding."""
    kind = _kind_of(engine)
    inst = _INSTRUMENTORS.setdefault(kind, Instrumentor(kind))
    if device_memory is None:
        from kvscope.engines.device import make_device_memory_reader

        device_memory = make_device_memory_reader()
    binding = inst.instrument(recorder, device_memory=device_memory)
    if engine is not None and not isinstance(engine, str):
        for manager in managers_of(engine):
            binding.discover(manager)
    return binding


def uninstrument(engine: Any = None) -> None:
    """Undo :func:`instrument` for one engine kind (None: every kind)."""
    kinds = list(_INSTRUMENTORS) if engine is None else [_kind_of(engine)]
    for kind in kinds:
        inst = _INSTRUMENTORS.get(kind)
        if inst is not None:
            inst.uninstrument()


def instrumentor_for(engine: Any) -> Instrumentor | None:
    return _INSTRUMENTORS.get(_kind_of(engine))
