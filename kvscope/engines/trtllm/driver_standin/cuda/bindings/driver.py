"""Accounting-only stand-in for ``cuda.bindings.driver`` (kvscope's own code, not NVIDIA's).

What it is for: TensorRT-LLM's KV cache manager V2 runtime (``tensorrt_llm/runtime/kv_cache_manager_v2``)
is pure Python around CUDA virtual-memory calls. With this module in place of the driver it runs on a
CPU and makes every allocation decision it would make on a GPU (pages, slots, eviction, resume gates),
because those decisions read only its own bookkeeping and the sizes the driver reports.

What it does: physical allocations (``cuMemCreate``) are counted against a fixed device size and
refused with ``CUDA_ERROR_OUT_OF_MEMORY`` past it; address reservations hand out distinct ranges;
mapping, access, host registration and copies succeed and are counted; streams and events are
always complete. What it does not do: hold data, time anything, or model bandwidth. Every call
returns the driver's tuple convention ``(CUresult, *values)``.

``CALLS`` counts calls by name (what a run asked of the driver).
"""

from __future__ import annotations

import enum
import itertools
from typing import Any

TOTAL_MEM_BYTES = 80 << 30
"""Device memory the stand-in reports (an 80 GiB card); allocations past it are refused."""

DEVICE_NAME = "kvscope accounting stand-in (no GPU)"
"""What ``cuDeviceGetName`` answers; ``cuDriverGetVersion`` answers 0 (no driver)."""

CALLS: dict[str, int] = {}
_in_use_bytes = 0
_handle_bytes: dict[int, int] = {}
_ids = itertools.count(1)
_addresses = itertools.count(1 << 40, 1 << 40)


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_NOT_PERMITTED = 800
    CUDA_ERROR_NOT_SUPPORTED = 801


OK = CUresult.CUDA_SUCCESS


class _Handle(int):
    """An opaque driver handle (stream, event, allocation)."""


CUevent = _Handle
CUstream = _Handle
CUmemGenericAllocationHandle = _Handle
CUdeviceptr = int


class CUevent_flags(enum.IntEnum):  # noqa: N801
    CU_EVENT_DISABLE_TIMING = 2


class CUstream_flags(enum.IntEnum):  # noqa: N801
    CU_STREAM_NON_BLOCKING = 1


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemAllocationHandleType(enum.IntEnum):
    CU_MEM_HANDLE_TYPE_NONE = 0
    CU_MEM_HANDLE_TYPE_FABRIC = 8


class CUmemAccess_flags(enum.IntEnum):  # noqa: N801
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


CU_STREAM_WAIT_VALUE_COMPLETED = 0
CU_MEMHOSTREGISTER_PORTABLE = 1
CU_MEMHOSTREGISTER_DEVICEMAP = 2


class _Fields:
    """A plain attribute holder (the driver's nested C structs)."""


class CUmemAllocationProp:
    def __init__(self) -> None:
        self.type: Any = None
        self.location = _Fields()
        self.location.type = None
        self.location.id = 0
        self.allocFlags = _Fields()
        self.allocFlags.gpuDirectRDMACapable = 0
        self.requestedHandleTypes = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE


class CUmemAccessDesc:
    def __init__(self) -> None:
        self.location = _Fields()
        self.location.type = None
        self.location.id = 0
        self.flags: Any = None


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


def _ok(name: str, *values: Any) -> tuple[Any, ...]:
    _count(name)
    return (OK, *values)


def in_use_bytes() -> int:
    """Physical bytes the runtime holds now (what ``cuMemCreate`` granted and ``cuMemRelease`` not freed)."""
    return _in_use_bytes


def cuGetErrorString(err: Any) -> tuple[Any, ...]:  # noqa: N802
    return (OK, str(err).encode())


def cuInit(flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuInit")


def cuCtxGetDevice() -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuCtxGetDevice", 0)


def cuDeviceGetName(length: int, device: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuDeviceGetName", DEVICE_NAME.encode()[: max(length - 1, 0)] + b"\0")


def cuDriverGetVersion() -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuDriverGetVersion", 0)


def cuCtxSynchronize() -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuCtxSynchronize")


def cuMemGetInfo() -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemGetInfo", TOTAL_MEM_BYTES - _in_use_bytes, TOTAL_MEM_BYTES)


def cuMemCreate(size: int, prop: CUmemAllocationProp, flags: int) -> tuple[Any, ...]:  # noqa: N802
    global _in_use_bytes
    _count("cuMemCreate")
    if prop.requestedHandleTypes == CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC:
        return (CUresult.CUDA_ERROR_NOT_SUPPORTED, None)
    if _in_use_bytes + size > TOTAL_MEM_BYTES:
        return (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
    handle = _Handle(next(_ids))
    _handle_bytes[int(handle)] = int(size)
    _in_use_bytes += int(size)
    return (OK, handle)


def cuMemRelease(handle: int) -> tuple[Any, ...]:  # noqa: N802
    global _in_use_bytes
    _in_use_bytes -= _handle_bytes.pop(int(handle), 0)
    return _ok("cuMemRelease")


def cuMemAddressReserve(size: int, align: int, addr: int, flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemAddressReserve", next(_addresses))


def cuMemAddressFree(ptr: int, size: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemAddressFree")


def cuMemMap(ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemMap")


def cuMemUnmap(ptr: int, size: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemUnmap")


def cuMemSetAccess(ptr: int, size: int, descs: Any, count: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemSetAccess")


def cuMemHostRegister(addr: int, size: int, flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemHostRegister")


def cuMemHostUnregister(addr: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemHostUnregister")


def cuMemcpyAsync(dst: int, src: int, size: int, stream: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuMemcpyAsync")


def cuEventCreate(flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuEventCreate", _Handle(next(_ids)))


def cuEventDestroy(event: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuEventDestroy")


def cuEventRecord(event: int, stream: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuEventRecord")


def cuEventQuery(event: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuEventQuery")


def cuEventSynchronize(event: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuEventSynchronize")


def cuStreamCreate(flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuStreamCreate", _Handle(next(_ids)))


def cuStreamDestroy(stream: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuStreamDestroy")


def cuStreamSynchronize(stream: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuStreamSynchronize")


def cuStreamWaitEvent(stream: int, event: int, flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _ok("cuStreamWaitEvent")
