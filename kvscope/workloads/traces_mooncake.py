"""Open-loop replay of the Mooncake FAST'25 traces (``conversation_trace.jsonl``, ``synthetic_trace.jsonl``).

Source: github.com/kvcache-ai/Mooncake ``FAST25-release/traces/*.jsonl`` @ 3b5a5941 (files last changed
in 3cca71da), format per ../shared/traces/SOURCES.md and the release README: one JSON object per line
with ``timestamp`` (arrival, **milliseconds** from the trace start), ``input_length``,
``output_length`` and ``hash_ids`` (512-token chained block hashes, ids global across the file, the
last one covering the partial tail: ``len(hash_ids) == ceil(input_length / 512)``).

Every row becomes one request arriving at ``timestamp / 1000 * time_scale`` seconds, whatever the
engine does (open loop: finishes release nothing). The file is read one line ahead of the clock, so
only the next row and the popped-but-unfinished ids are held. Ids are global, so one key namespace
serves the whole file and equal prefixes across requests share engine blocks; the 512-token hash
blocks are mapped onto the engine's ``tokens_per_block`` by ``workload.map_hash_blocks``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any

from ._trace_fields import as_id_array, int_field, number_field
from .workload import (
    TraceFormatError,
    WorkloadRequest,
    check_tokens_per_block,
    map_hash_blocks,
    num_uncovered,
)

__all__ = ["MooncakeTraceWorkload", "create_mooncake_workload"]

MOONCAKE_TOKENS_PER_BLOCK = 512
_NAMESPACE = 1  # ids are global to the file: one namespace for all its requests


class MooncakeTraceWorkload:
    """Open-loop Mooncake replay (see module docstring).

    Args:
        tokens_per_block: the engine's tokens per block.
        seed: unused by the replay itself (arrivals are recorded); kept for a uniform constructor.
        path: the ``.jsonl`` trace.
        time_scale: multiplies every arrival time (0.5 replays twice as fast; > 0).
        max_requests: stop after this many rows (None: the whole file).
        trace_tokens_per_block: tokens per hash block in the file (512 for Mooncake).
    """

    def __init__(
        self,
        tokens_per_block: int,
        seed: int = 0,
        *,
        path: str | Path,
        time_scale: float = 1.0,
        max_requests: int | None = None,
        trace_tokens_per_block: int = MOONCAKE_TOKENS_PER_BLOCK,
    ) -> None:
        check_tokens_per_block(tokens_per_block, trace_tokens_per_block)
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale}")
        if max_requests is not None and max_requests < 1:
            raise ValueError(f"max_requests must be >= 1 or None, got {max_requests}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"trace not found: {path}")
        self.tokens_per_block = tokens_per_block
        self.seed = seed
        self.path = str(path)
        self.time_scale = float(time_scale)
        self.max_requests = max_requests
        self.trace_tokens_per_block = trace_tokens_per_block
        self._fh: IO[str] | None = open(self.path, encoding="utf-8")  # noqa: SIM115 (streamed)
        self._line_no = 0
        self._num_read = 0
        self._last_timestamp = 0.0
        self._num_uncovered_keys = 0
        self._next: WorkloadRequest | None = None
        self._in_flight: set[int] = set()
        self._read_ahead()
        if self._next is None:  # the first row is read here, so an empty trace is refused up front
            lines = f"its {self._line_no} line(s) are blank" if self._line_no else "the file is empty"
            raise TraceFormatError(self.path, "file", "<rows>", f"trace holds no requests ({lines})")

    # ----------------------------------------------------------------- protocol
    def pop_arrivals(self, now_s: float) -> list[WorkloadRequest]:
        """Rows with arrival_s <= now_s, in file order."""
        out: list[WorkloadRequest] = []
        while self._next is not None and self._next.arrival_s <= now_s:
            out.append(self._next)
            self._in_flight.add(self._next.request_id)
            self._read_ahead()
        return out

    def next_arrival_s(self) -> float | None:
        """Arrival of the next unread row (None once the file is done)."""
        return None if self._next is None else self._next.arrival_s

    def on_finished(self, request_id: int, now_s: float, *, failed: bool = False) -> None:
        """Open loop: a finish releases nothing; unknown ids raise ValueError."""
        try:
            self._in_flight.remove(request_id)
        except KeyError:
            raise ValueError(
                f"on_finished: request {request_id} is not in flight in this workload"
            ) from None

    def is_exhausted(self) -> bool:
        """True once every row was popped."""
        return self._next is None

    def describe(self) -> dict[str, Any]:
        """Knobs and their values (for ``kvscope replay --list-knobs``)."""
        return {
            "workload": "mooncake-trace",
            "path": self.path,
            "tokens_per_block": self.tokens_per_block,
            "seed": self.seed,
            "time_scale": self.time_scale,
            "max_requests": self.max_requests,
            "trace_tokens_per_block": self.trace_tokens_per_block,
        }

    def close(self) -> None:
        """Close the file early (it closes by itself at its end)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # ----------------------------------------------------------------- reading
    def _read_ahead(self) -> None:
        self._next = None
        if self._fh is None:
            return
        if self.max_requests is not None and self._num_read >= self.max_requests:
            self.close()
            return
        while True:
            line = self._fh.readline()
            if not line:
                self.close()
                return
            self._line_no += 1
            if line.strip():
                break
        self._next = self._parse(line)
        self._num_read += 1

    def _parse(self, line: str) -> WorkloadRequest:
        loc = f"line {self._line_no}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise TraceFormatError(self.path, loc, "<json>", f"not valid JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise TraceFormatError(self.path, loc, "<json>", "each line must be a JSON object")
        timestamp = number_field(self.path, loc, row, "timestamp")
        assert timestamp is not None
        if timestamp < self._last_timestamp:
            raise TraceFormatError(
                self.path,
                loc,
                "timestamp",
                f"must not decrease, got {timestamp} after {self._last_timestamp}",
            )
        self._last_timestamp = timestamp
        prompt_len = int_field(self.path, loc, row, "input_length", minimum=1)
        output_len = int_field(self.path, loc, row, "output_length", minimum=0)
        ids = as_id_array(self.path, loc, row, "hash_ids")
        expected = math.ceil(prompt_len / self.trace_tokens_per_block)
        if len(ids) != expected:
            raise TraceFormatError(
                self.path,
                loc,
                "hash_ids",
                f"must hold ceil(input_length / {self.trace_tokens_per_block}) = {expected} ids, "
                f"got {len(ids)}",
            )
        keys = map_hash_blocks(
            ids,
            prompt_len=prompt_len,
            trace_tokens_per_block=self.trace_tokens_per_block,
            tokens_per_block=self.tokens_per_block,
            namespace=_NAMESPACE,
            covered_tokens=prompt_len,
            first_uncovered_id=self._num_uncovered_keys,
        )
        self._num_uncovered_keys += num_uncovered(prompt_len, self.tokens_per_block, prompt_len)
        return WorkloadRequest(
            request_id=self._num_read + 1,
            arrival_s=timestamp / 1000.0 * self.time_scale,
            prompt_len=prompt_len,
            output_len=max(1, output_len),
            block_keys=keys,
        )


def create_mooncake_workload(
    path: str | Path,
    *,
    tokens_per_block: int,
    seed: int = 0,
    time_scale: float = 1.0,
    max_requests: int | None = None,
) -> MooncakeTraceWorkload:
    """Factory used by the scenario registry and ``kvscope replay --trace X.jsonl``."""
    return MooncakeTraceWorkload(
        tokens_per_block, seed, path=path, time_scale=time_scale, max_requests=max_requests
    )
