"""Workload contract of the CPU engine model, and trace hash blocks mapped onto engine blocks.

A workload hands the executor ``WorkloadRequest`` records: a prompt described by its length and the
chained keys of its FULL engine blocks (never tokens), an output length, and an arrival time. Open-loop
workloads (Mooncake) know every arrival in advance; closed-loop ones (Claude Code sessions, synthetic
scenarios) release a request only when an earlier one of the same client finished, so the executor
reports finishes back through ``on_finished``.

Block keys. Public traces carry one hash id per trace block (64 tokens for kv-cache-tester, 512 for
Mooncake). The ids are chained (an equal id means an equal prefix up to and including that block) and
the engine's ``tokens_per_block`` differs from the trace's, so ``map_hash_blocks`` derives one key per
full engine block from *the trace block in which the engine block ends* and *how many tokens of that
trace block it covers*:

    trace (64 tok):  |    id 7     |    id 9     |    id 4     |..tail..|
    engine (32 tok): |(7,32)|(7,64)|(9,32)|(9,64)|(4,32)|(4,64)|(u)|       u: uncovered, unique key
    engine (128):    |    -> (9,64)              |   (partial: no key)   |

Because id ``t`` names the whole prefix through trace block ``t``, the pair (id, tokens covered)
names the whole prefix up to the engine block's end, so equal keys always mean equal prefixes (chain
property). Splitting is conservative: two prompts that agree on the first half of a trace block but
not on its second half get different keys for the first half (a missed reuse, never a false one).
Full engine blocks beyond the tokens the trace hashed (kv-cache-tester drops its partial tail block)
get fresh keys that match nothing. ``len(block_keys) == prompt_len // tokens_per_block`` always.

Keys are packed non-negative int64 values ``namespace | trace id | tokens covered`` (see
``make_block_key``), collision-free by construction. Namespace 0 is shared across sessions (the
Claude Code tools+system prefix); every session start takes a fresh namespace, because the trace's
ids are local to a file (``hash_id_scope == "local"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "MAX_NAMESPACE",
    "SHARED_NAMESPACE",
    "TraceFormatError",
    "Workload",
    "WorkloadRequest",
    "make_block_key",
    "map_hash_blocks",
]

_OFFSET_BITS = 11  # tokens covered within a trace block: 0..2047 (0 marks an uncovered block)
_ID_BITS = 32  # trace hash id (local or global) or a per-namespace counter
_NS_BITS = 63 - _OFFSET_BITS - _ID_BITS  # 20 bits: keys stay below 2**63 (numpy int64, Python int)
MAX_TRACE_TOKENS_PER_BLOCK = (1 << _OFFSET_BITS) - 1
MAX_TRACE_ID = (1 << _ID_BITS) - 1
MAX_NAMESPACE = (1 << _NS_BITS) - 1
SHARED_NAMESPACE = 0


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """One request as a workload releases it to the executor.

    Attributes:
        request_id: unique within the workload (starts at 1).
        arrival_s: earliest simulated time (s) it may arrive; closed loop: set when released.
        prompt_len: prompt tokens (> 0).
        output_len: tokens to generate (>= 1; a trace's 0 becomes 1, the engine always emits one).
        block_keys: chained keys of the prompt's full engine blocks, already mapped to the engine's
            tokens_per_block; exactly prompt_len // tokens_per_block of them.
        session_id: the client/session that sent it (-1: none).
    """

    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    block_keys: tuple[int, ...]
    session_id: int = -1


@runtime_checkable
class Workload(Protocol):
    """What the executor drives. Single-threaded; times are simulated seconds, non-decreasing."""

    tokens_per_block: int

    def pop_arrivals(self, now_s: float) -> list[WorkloadRequest]:
        """All requests with arrival_s <= now_s, in arrival order; each is returned once."""
        ...

    def next_arrival_s(self) -> float | None:
        """Earliest pending arrival; None: nothing pending now (closed loop waits on finishes)."""
        ...

    def on_finished(self, request_id: int, now_s: float, *, failed: bool = False) -> None:
        """A popped request completed (or failed / was rejected). Unknown ids raise ValueError."""
        ...

    def is_exhausted(self) -> bool:
        """True when no more requests will ever arrive."""
        ...


class TraceFormatError(ValueError):
    """A trace file breaks its documented format. Names the file, the row or member, and the field."""

    def __init__(self, path: str, location: str, field: str, problem: str) -> None:
        self.path = path
        self.location = location
        self.field = field
        self.problem = problem
        super().__init__(f"{path}: {location}: field '{field}': {problem}")


def make_block_key(namespace: int, trace_id: int, num_tokens_covered: int) -> int:
    """Pack (namespace, trace id, tokens of that trace block covered) into one int64 key.

    ``num_tokens_covered`` 0 is reserved for blocks the trace never hashed (``trace_id`` is then a
    per-namespace counter). Raises ValueError when a part does not fit its bit field.
    """
    if not 0 <= namespace <= MAX_NAMESPACE:
        raise ValueError(f"namespace must be in [0, {MAX_NAMESPACE}], got {namespace}")
    if not 0 <= trace_id <= MAX_TRACE_ID:
        raise ValueError(f"trace_id must be in [0, {MAX_TRACE_ID}], got {trace_id}")
    if not 0 <= num_tokens_covered <= MAX_TRACE_TOKENS_PER_BLOCK:
        raise ValueError(
            f"num_tokens_covered must be in [0, {MAX_TRACE_TOKENS_PER_BLOCK}], got {num_tokens_covered}"
        )
    return (
        (namespace << (_ID_BITS + _OFFSET_BITS)) | (trace_id << _OFFSET_BITS) | num_tokens_covered
    )


def map_hash_blocks(
    hash_ids: np.ndarray | list[int] | tuple[int, ...],
    *,
    prompt_len: int,
    trace_tokens_per_block: int,
    tokens_per_block: int,
    namespace: int,
    covered_tokens: int,
    num_shared_trace_blocks: int = 0,
    first_uncovered_id: int = 0,
    first_block: int = 0,
) -> tuple[int, ...]:
    """Chained keys of the prompt's full engine blocks from a trace's chained hash ids.

    Args:
        hash_ids: the request's trace hash ids, in prompt order (ids < 2**32).
        prompt_len: prompt tokens; the result has prompt_len // tokens_per_block keys.
        trace_tokens_per_block: tokens per trace block (64 kv-cache-tester, 512 Mooncake).
        tokens_per_block: the engine's tokens per block.
        namespace: key namespace of this request's ids (a session's, or the file's for global ids).
        covered_tokens: prompt tokens the ids describe (kv-cache-tester: 64 * len(hash_ids), its
            partial tail is not hashed; Mooncake: input_length, its last id is a partial block).
        num_shared_trace_blocks: leading trace blocks that are the cross-session shared prefix; an
            engine block ending in one of them is keyed in ``SHARED_NAMESPACE`` by position.
        first_uncovered_id: counter value for the first full engine block beyond covered_tokens;
            the caller advances its counter by the number of such blocks (see ``num_uncovered``).
        first_block: return only the keys of engine blocks first_block.. (a caller that already
            holds the keys of an unchanged prefix appends the rest; saves re-deriving them).

    Returns:
        Tuple of int keys, one per full engine block from first_block on.
    """
    num_blocks = prompt_len // tokens_per_block
    first = min(max(0, first_block), num_blocks)
    if first >= num_blocks:
        return ()
    ids = np.asarray(hash_ids, dtype=np.int64)
    covered = min(covered_tokens, prompt_len, len(ids) * trace_tokens_per_block)
    num_covered = covered // tokens_per_block  # engine blocks ending at or before `covered`
    ends = np.arange(first + 1, max(first, num_covered) + 1, dtype=np.int64) * tokens_per_block
    trace_index = (ends - 1) // trace_tokens_per_block
    offsets = ends - trace_index * trace_tokens_per_block
    key_ids = ids[trace_index]
    ns = np.full(len(ends), namespace, dtype=np.int64)
    if num_shared_trace_blocks > 0:
        shared = trace_index < num_shared_trace_blocks
        ns[shared] = SHARED_NAMESPACE
        key_ids = np.where(shared, trace_index, key_ids)
    keys = (ns << (_ID_BITS + _OFFSET_BITS)) | (key_ids << _OFFSET_BITS) | offsets
    out = keys.tolist()
    if num_covered < num_blocks:
        base = namespace << (_ID_BITS + _OFFSET_BITS)
        start = max(first, num_covered)
        out.extend(
            base | ((first_uncovered_id + j - num_covered) << _OFFSET_BITS)
            for j in range(start, num_blocks)
        )
    return tuple(out)


def num_uncovered(prompt_len: int, tokens_per_block: int, covered_tokens: int) -> int:
    """Full engine blocks of a prompt that end beyond the hashed tokens (they get fresh keys)."""
    num_blocks = prompt_len // tokens_per_block
    return max(0, num_blocks - min(covered_tokens, prompt_len) // tokens_per_block)


def check_tokens_per_block(
    tokens_per_block: object, trace_tokens_per_block: int | None = None
) -> int:
    """Validate the engine's tokens_per_block (a positive int); returns it."""
    if isinstance(tokens_per_block, bool) or not isinstance(tokens_per_block, int):
        raise ValueError(f"tokens_per_block must be an int, got {tokens_per_block!r}")
    if tokens_per_block < 1:
        raise ValueError(f"tokens_per_block must be >= 1, got {tokens_per_block}")
    if trace_tokens_per_block is not None and not (
        1 <= trace_tokens_per_block <= MAX_TRACE_TOKENS_PER_BLOCK
    ):
        raise ValueError(
            f"trace_tokens_per_block must be in [1, {MAX_TRACE_TOKENS_PER_BLOCK}], "
            f"got {trace_tokens_per_block}"
        )
    return tokens_per_block
