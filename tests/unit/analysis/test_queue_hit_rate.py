"""The queue's need in the target counts its reuse at no more than the hit rate now: requests that
waited while the target's cache stopped hitting are not assumed to hit (bench/RESULTS.md, the
twins of session 20: seed 89's twin whose waiting prompts share nothing drew a critical from the
resume rule at the hit rate of their arrival, while its admissions reused nothing). Batch
(:func:`kvscope.analysis.queue.queued_need`) and streaming
(:meth:`~kvscope.analysis.streaming.StreamingAnalyzer.queued_blocks`) agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
from analysis_script import EventScript

from kvscope.analysis import events_to_frame
from kvscope.analysis.columns import as_columns, count_below
from kvscope.analysis.frame import pool_configs
from kvscope.analysis.queue import queued_need
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.events import PoolRole

TPB, PROMPT, WINDOW = 16, 320, 16


def _stream(hit_then: float, hit_now: float, *, waiting: int = 6):
    """``WINDOW`` admissions reusing ``hit_then`` of their prompts, ``waiting`` arrivals, then
    ``WINDOW`` admissions reusing ``hit_now``; the waiting requests are never admitted."""
    s = EventScript(target_blocks=10_000, draft_blocks=10_000, tpb=TPB)
    rid = 0
    for hit, arrive in ((hit_then, True), (hit_now, False)):
        for _ in range(WINDOW):
            rid += 1
            s.iteration()
            s.arrive(rid, PROMPT)
            s.admit(rid, reused=int(hit * PROMPT))
        if arrive:
            for k in range(waiting):
                s.arrive(1000 + k, PROMPT)
    s.iteration()
    s.snapshot()
    return s.rec.drain()


def _batch(events, *, now: bool = True) -> float:
    frame = events_to_frame(events)
    ev = as_columns(frame)
    q_pos = np.array([len(ev) - 1])
    got = queued_need(ev, pool_configs(frame).loc[PoolRole.TARGET.value], PoolRole.TARGET, WINDOW,
                      count_below(q_pos, len(ev)), 1, q_pos if now else None)
    return float(got[0])


def _streaming(events) -> float:
    sa = StreamingAnalyzer(hit_window=WINDOW)
    sa.feed(events)
    return sa.queued_blocks(PoolRole.TARGET.value)


def test_a_cache_that_stopped_hitting_is_not_credited_to_the_requests_already_waiting():
    events = _stream(0.9, 0.0)
    total = PROMPT + 1  # prompt + the draft token the target reserves (max_draft_len 1)
    at_arrival = 6 * math.ceil((total - 0.9 * PROMPT) / TPB)
    assert _batch(events, now=False) == at_arrival  # the estimate of their arrival alone
    assert _batch(events) == pytest.approx(6 * total / TPB)  # nothing hits now: whole prompts
    assert _streaming(events) == _batch(events)


def test_a_cache_that_started_hitting_leaves_the_estimate_of_their_arrival():
    events = _stream(0.0, 0.9)
    assert _batch(events) == _batch(events, now=False) == 6 * math.ceil((PROMPT + 1) / TPB)
    assert _streaming(events) == _batch(events)
