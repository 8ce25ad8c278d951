"""Seam records: which engine methods kvscope wraps, with the signature and commit they were read at.

A :class:`Seam` names one method on one class of one module (``KVCacheManagerV2.prepare_resources``
in ``tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2``), the parameter list read in the
real source and the commit it was read at. :func:`check_seams` compares a table of seams against
classes that are actually importable (or handed in) and reports every difference in plain words,
so kvscope refuses to patch blindly:

* the module cannot be imported,
* the class is missing,
* the method is missing,
* the parameters changed (names, order or kind; annotations and defaults are ignored).

The signature is stored as text, ``"(self, req, num_tokens)"``, parsed with :mod:`ast` (never
executed). A property is recorded as ``"property"``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

PROPERTY = "property"


@dataclass(frozen=True, slots=True)
class Seam:
    """One wrapped engine method, as read in the engine's source.

    Attributes:
        module: dotted module that defines the class.
        qualname: ``Class.method``.
        signature: parameter list as text, ``"(self, scheduled_batch)"``; ``"property"`` for one.
        commit: full 40-hex commit of ``NVIDIA/TensorRT-LLM`` the signature was read at.
        records: what kvscope records there (one line).
        note: differences or caveats (e.g. only on newer code).
    """

    module: str
    qualname: str
    signature: str
    commit: str
    records: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if self.qualname.count(".") != 1:
            raise ValueError(f"qualname must be 'Class.method', got {self.qualname!r}")
        if len(self.commit) != 40 or any(c not in "0123456789abcdef" for c in self.commit):
            raise ValueError(f"commit must be 40 lower-case hex digits, got {self.commit!r}")
        if self.signature != PROPERTY:
            parse_parameters(self.signature)  # validate at construction

    @property
    def class_name(self) -> str:
        return self.qualname.split(".")[0]

    @property
    def method_name(self) -> str:
        return self.qualname.split(".")[1]

    @property
    def parameters(self) -> tuple[tuple[str, str], ...]:
        """``(name, kind)`` pairs; kind is 'positional', 'keyword', '*args' or '**kwargs'."""
        if self.signature == PROPERTY:
            return ()
        return parse_parameters(self.signature)


class MismatchKind(str, Enum):
    MISSING_MODULE = "missing_module"
    MISSING_CLASS = "missing_class"
    MISSING_METHOD = "missing_method"
    CHANGED_PARAMETERS = "changed_parameters"


@dataclass(frozen=True, slots=True)
class SeamMismatch:
    """One difference between a seam record and the classes found."""

    seam: Seam
    kind: MismatchKind
    detail: str

    def __str__(self) -> str:
        return f"{self.seam.qualname} ({self.seam.module}): {self.detail}"


@dataclass(frozen=True, slots=True)
class SeamResult:
    """Outcome of checking one seam: ``mismatch`` is None when it matched."""

    seam: Seam
    mismatch: SeamMismatch | None

    @property
    def ok(self) -> bool:
        return self.mismatch is None

    def describe(self) -> str:
        if self.mismatch is None:
            return f"ok: {self.seam.qualname}{'' if self.seam.signature == PROPERTY else self.seam.signature}"
        return f"MISMATCH: {self.mismatch}"


def parse_parameters(signature: str) -> tuple[tuple[str, str], ...]:
    """Parse ``"(self, a, *, b=1, **kw)"`` into ``(("self","positional"), ("a","positional"), ...)``."""
    try:
        tree = ast.parse(f"def _f{signature}: pass")
    except SyntaxError as e:
        raise ValueError(f"signature must look like '(self, arg, ...)', got {signature!r}") from e
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    a = fn.args
    out: list[tuple[str, str]] = [(p.arg, "positional") for p in (*a.posonlyargs, *a.args)]
    if a.vararg is not None:
        out.append((a.vararg.arg, "*args"))
    out.extend((p.arg, "keyword") for p in a.kwonlyargs)
    if a.kwarg is not None:
        out.append((a.kwarg.arg, "**kwargs"))
    return tuple(out)


_KIND_NAMES = {
    inspect.Parameter.POSITIONAL_ONLY: "positional",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
    inspect.Parameter.VAR_POSITIONAL: "*args",
    inspect.Parameter.KEYWORD_ONLY: "keyword",
    inspect.Parameter.VAR_KEYWORD: "**kwargs",
}


def live_parameters(func: Callable[..., object]) -> tuple[tuple[str, str], ...]:
    """``(name, kind)`` pairs of a live function (unwrapping wrapt proxies and decorators)."""
    sig = inspect.signature(inspect.unwrap(func), follow_wrapped=True)
    return tuple((p.name, _KIND_NAMES[p.kind]) for p in sig.parameters.values())


def _format(params: tuple[tuple[str, str], ...]) -> str:
    parts = []
    for name, kind in params:
        parts.append({"*args": "*", "**kwargs": "**"}.get(kind, "") + name + ("(kw)" if kind == "keyword" else ""))
    return "(" + ", ".join(parts) + ")"


def check_seam_against(seam: Seam, cls: type | None) -> SeamMismatch | None:
    """Compare one seam with a class (None: the class was not found)."""
    if cls is None:
        return SeamMismatch(seam, MismatchKind.MISSING_CLASS, f"class {seam.class_name} not found")
    attr = inspect.getattr_static(cls, seam.method_name, None)
    if attr is None:
        return SeamMismatch(
            seam, MismatchKind.MISSING_METHOD, f"method {seam.method_name} not found on {cls.__name__}"
        )
    if seam.signature == PROPERTY:
        if not isinstance(attr, property):
            return SeamMismatch(seam, MismatchKind.CHANGED_PARAMETERS, f"{seam.method_name} is not a property")
        return None
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    if isinstance(attr, property) or not callable(attr):
        return SeamMismatch(seam, MismatchKind.CHANGED_PARAMETERS, f"{seam.method_name} is not a method")
    try:
        found = live_parameters(attr)
    except (TypeError, ValueError):
        return None  # builtin or C-level: no signature to compare, treat as present
    expected = seam.parameters
    if found != expected:
        return SeamMismatch(
            seam,
            MismatchKind.CHANGED_PARAMETERS,
            f"parameters changed: recorded {_format(expected)} at {seam.commit[:8]}, found {_format(found)}",
        )
    return None


def _import_class(module: str, class_name: str) -> tuple[type | None, str | None]:
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # any import failure is a finding, not a crash
        return None, f"module {module} cannot be imported ({type(e).__name__}: {e})"
    cls = getattr(mod, class_name, None)
    return (cls if isinstance(cls, type) else None), None


def seam_results(
    seams: Iterable[Seam], *, classes: Mapping[str, type | None] | None = None
) -> list[SeamResult]:
    """Check every seam; one :class:`SeamResult` each, in table order.

    Args:
        seams: the table to check.
        classes: real class name -> class to check against (e.g. the engine model's classes,
            ``{"KVCacheManagerV2": KVCacheManagerV2Model}``). When None, each seam's module is
            imported and the class looked up by name.
    """
    results = []
    for seam in seams:
        if classes is not None:
            mismatch = check_seam_against(seam, classes.get(seam.class_name))
        else:
            cls, import_error = _import_class(seam.module, seam.class_name)
            if import_error is not None:
                mismatch = SeamMismatch(seam, MismatchKind.MISSING_MODULE, import_error)
            else:
                mismatch = check_seam_against(seam, cls)
        results.append(SeamResult(seam, mismatch))
    return results


def check_seams(
    seams: Iterable[Seam], *, classes: Mapping[str, type | None] | None = None
) -> list[SeamMismatch]:
    """Every mismatch between ``seams`` and the classes found (empty: all match). Never raises."""
    return [r.mismatch for r in seam_results(seams, classes=classes) if r.mismatch is not None]
