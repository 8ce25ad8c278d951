"""Factories for the workload tests: tiny kv-cache-tester archives and a minimal executor loop."""

from __future__ import annotations

import heapq
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.workloads.workload import Workload, WorkloadRequest


def make_request(
    t: float,
    hash_ids: list[int],
    *,
    tail_tokens: int = 10,
    out: int = 8,
    api_time: float | None = 1.0,
    think_time: float | None = 0.0,
) -> dict[str, Any]:
    """One kv-cache-tester LLM request: ``in`` = 64 per id + an unhashed tail."""
    req: dict[str, Any] = {
        "t": t,
        "type": "n",
        "model": "claude-test",
        "in": 64 * len(hash_ids) + tail_tokens,
        "out": out,
        "hash_ids": hash_ids,
    }
    if api_time is not None:
        req["api_time"] = api_time
    if think_time is not None:
        req["think_time"] = think_time
    return req


def make_session(
    requests: list[dict[str, Any]], *, tool_tokens: int = 128, system_tokens: int = 64
) -> dict[str, Any]:
    """One trace file (session); (tool + system) // 64 = 3 shared blocks by default."""
    return {
        "id": "test",
        "models": ["claude-test"],
        "block_size": 64,
        "hash_id_scope": "local",
        "tool_tokens": tool_tokens,
        "system_tokens": system_tokens,
        "requests": requests,
        "totals": {},
    }


def write_archive(path: Path, members: dict[str, dict[str, Any] | bytes]) -> Path:
    """A .tar.xz holding ``traces/<name>`` members (dicts are JSON-encoded, bytes kept as is)."""
    with tarfile.open(path, "w:xz") as tf:
        for name, doc in members.items():
            data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            info = tarfile.TarInfo(f"traces/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def run_to_end(
    workload: Workload,
    service_s: Callable[[WorkloadRequest], float] = lambda r: 1.0,
    *,
    max_finishes: int = 100_000,
) -> list[tuple[float, WorkloadRequest]]:
    """Drive a workload like the executor does (until exhausted and drained), each request taking
    service_s(request) seconds.

    Returns (pop time, request) in pop order.
    """
    now = 0.0
    finishing: list[tuple[float, int]] = []
    popped: list[tuple[float, WorkloadRequest]] = []
    finishes = 0
    while (finishing or not workload.is_exhausted()) and finishes < max_finishes:
        nxt = workload.next_arrival_s()
        if finishing and (nxt is None or finishing[0][0] < nxt):
            now, rid = heapq.heappop(finishing)
            workload.on_finished(rid, now)
            finishes += 1
        elif nxt is None:
            raise AssertionError("workload stalled: nothing pending and nothing in flight")
        else:
            now = max(now, nxt)
        for req in workload.pop_arrivals(now):
            popped.append((now, req))
            heapq.heappush(finishing, (now + service_s(req), req.request_id))
    return popped
