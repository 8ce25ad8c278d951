"""Package attributes that load on first read (PEP 562), shared by the packages whose public names
include heavy ones: ``kvscope.analysis`` (pandas), ``kvscope.recording`` (pyarrow, pandas) and
``kvscope.otel`` (the OpenTelemetry SDK). Importing such a package stays cheap, so the analyzer
child and an engine worker's recorder start without those libraries (pinned by
tests/unit/commands/test_analysis_child_imports.py). Standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, names: Mapping[str, str], namespace: dict[str, Any]
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``names`` maps each lazy
    name to the module that defines it; ``namespace`` is the package's ``globals()``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # read once: later reads skip this hook
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
