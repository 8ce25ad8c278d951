"""Device memory figures for the per-iteration snapshot, where torch and CUDA exist.

:func:`make_device_memory_reader` returns None when torch is not importable or CUDA is not
available (checked once), so the snapshot hook skips the figures at the cost of one ``None`` test.
Otherwise the reader returns bytes: ``device_free_bytes`` / ``device_total_bytes`` (driver view,
``torch.cuda.mem_get_info``) and ``device_allocated_bytes`` / ``device_reserved_bytes`` (the caching
allocator), stamped into POOL_SNAPSHOT's reason with ``format_kv``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def make_device_memory_reader(device: int | None = None) -> Callable[[], dict[str, int] | None] | None:
    try:
        torch = importlib.import_module("torch")
        if not torch.cuda.is_available():
            return None
    except Exception:
        return None

    def read() -> dict[str, int] | None:
        try:
            free, total = torch.cuda.mem_get_info(device)
            return {
                "device_free_bytes": int(free),
                "device_total_bytes": int(total),
                "device_allocated_bytes": int(torch.cuda.memory_allocated(device)),
                "device_reserved_bytes": int(torch.cuda.memory_reserved(device)),
            }
        except Exception:
            return None

    return read
