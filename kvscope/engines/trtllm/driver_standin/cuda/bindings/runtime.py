"""Accounting-only stand-in for ``cuda.bindings.runtime``: the two calls the KV manager runtime makes."""

from __future__ import annotations

import enum


class cudaError_t(enum.IntEnum):  # noqa: N801 - the driver's own spelling
    cudaSuccess = 0


def cudaFree(ptr: int) -> tuple[cudaError_t]:  # noqa: N802
    return (cudaError_t.cudaSuccess,)


def cudaDeviceSynchronize() -> tuple[cudaError_t]:  # noqa: N802
    return (cudaError_t.cudaSuccess,)
