"""Requests certain to finish within a horizon (:mod:`kvscope.analysis.finishes`): the bound the
resume-ceiling rule counts where the trailing free rate alone leaves it past the ceiling.

Fixtures (``data/``): ``qwen-hybrid-mtp-rc27`` (``kvscope replay --scenario qwen-hybrid-mtp --set
seed=0 --events ...``, 1.3.0rc27: twelve 80k-token prompts with 16 output tokens, chunks ending at
2,048-token snapshot points, four prefills side by side; "Failed to resume draft KV cache for
request 10" at iteration 42), ``glm5-dsa-seed1`` (glm5-dsa, 1.3.0rc25, chunked prefill under the
whole token budget) and ``claude-code-rc27-reuse-off`` (the Claude Code traces, ``--set
enable_block_reuse=false --set engine_version=1.3.0rc27 --set seed=30``: generating requests
suspended in both pools while they sit at their ceilings; "Failed to resume draft KV cache for
request 335" at iteration 6,413).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kvscope.analysis import analyze_files
from kvscope.analysis.ceiling import crossing_iterations
from kvscope.analysis.columns import as_columns
from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.debt import compute_debt
from kvscope.analysis.finishes import chunk_stride
from kvscope.analysis.live_projections import sure_frees
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.recording import read_frame
from kvscope.recording.reader import frame_to_rows

DATA = Path(__file__).parent / "data"
FIXTURES = ["qwen-hybrid-mtp-rc27", "glm5-dsa-seed1", "claude-code-rc27-reuse-off"]
HYBRID = DATA / "qwen-hybrid-mtp-rc27.parquet"
HORIZONS = (0.0, 5.0, 20.0, 60.0, 200.0, math.inf)


def _batch(path: Path):
    ev = as_columns(read_frame(path))
    debt = compute_debt(ev)
    f = debt.full["draft"]
    ends = ev.iteration_ends()
    return ev, debt.index_of(ends), ev.iteration[ends], f["resume"]["finishes"]


def _streamed_at_ends(path: Path) -> dict[tuple[int, float], tuple[float, float]]:
    """The streaming analyzer's sure_frees at every iteration end (state before the next
    iteration's first event), per horizon."""
    sa = StreamingAnalyzer(max_findings=100_000)
    out = {}
    rows = list(frame_to_rows(read_frame(path)))
    for i, row in enumerate(rows):
        sa.feed([row])
        nxt = rows[i + 1][1] if i + 1 < len(rows) else None
        if nxt != row[1] and "draft" in sa._configs:
            for h in HORIZONS:
                out[(int(row[1]), h)] = sure_frees(sa, "draft", h)
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_the_streaming_analyzer_counts_the_same_certain_finishes_as_the_batch(name):
    path = DATA / f"{name}.parquet"
    _ev, qi, its, fin = _batch(path)
    live = _streamed_at_ends(path)
    counted = 0
    for h in HORIZONS:
        pre, dec = fin.sure_frees(qi, np.full(len(qi), h))
        for it, p, d in zip(its, pre, dec):
            if (int(it), h) in live:
                assert live[(int(it), h)] == (p, d), (name, int(it), h)
                counted += p > 0 or d > 0
    assert counted > 0  # the fixtures do have certain finishes to compare


def test_a_longer_horizon_never_counts_fewer_pages():
    _ev, qi, _its, fin = _batch(HYBRID)
    prev = None
    for h in HORIZONS:
        pre, dec = fin.sure_frees(qi, np.full(len(qi), h))
        if prev is not None:
            assert (pre + dec >= prev).all()
        prev = pre + dec
    assert prev.max() > 0


def test_prefill_bound_on_the_hybrid_fixture_is_its_chunks_then_its_output():
    """Twelve 80,000-token prompts, 2,048-token chunks one per iteration, 16 output tokens: after
    its first chunk a request needs ceil(77,952 / 2,048) = 39 steps of prefill and 16 of decode,
    55 iterations -- certain within 55, not within 54."""
    ev, qi, its, fin = _batch(HYBRID)
    at = int(np.flatnonzero(its == 0)[0])
    assert chunk_stride(ev, np.array([ev.iteration_ends()[-1]]))[0] == 1.0
    pre55, _ = fin.sure_frees(qi[at : at + 1], np.array([55.0]))
    pre54, _ = fin.sure_frees(qi[at : at + 1], np.array([54.0]))
    assert pre55[0] > 0 and pre54[0] == 0


def test_the_queue_crosses_after_the_prefills_ahead_and_a_chunk_per_request_when_chunks_run_side_by_side():
    """Budget 8,192 tokens, 64-token blocks. Admitted prefills need 640 target blocks (5
    iterations); the queue's first half fills the room below the ceiling. Chunks capped at 2,048
    (several prefills side by side): 2 of 4 requests, one chunk each, half an iteration more.
    Chunks as large as the budget: the next request waits for the whole prompt of the one before
    (1,000 blocks for the half: 7.8 iterations more)."""
    args = dict(head=500.0, admitted=0.0, q_gross=1000.0, q_gross_t=2000.0, n_gross=4.0, target_need=640.0,
                target_tpb=64.0, budget_tokens=8192.0)
    side = float(crossing_iterations(**args, max_chunk=2048.0, span=100.0))
    whole = float(crossing_iterations(**args, max_chunk=8192.0, span=100.0))
    assert side == pytest.approx(5.0 + 2 * 2048 / 8192)
    assert whole == pytest.approx(5.0 + 1000 * 64 / 8192)
    assert float(crossing_iterations(**args, max_chunk=8192.0, span=6.0)) == 6.0  # at most the span


def test_switched_off_the_rule_reads_the_rate_alone():
    """The hybrid prefills finish (iteration 55) after they give the budget up and the queue's
    mirrors are admitted (40): they do not offset them, and the crash stays critical from the
    first iterations, with the certain finishes counted or not. Counted over the whole span
    instead (the queue's prompts through the budget: 80 iterations), they would."""
    on = analyze_files(HYBRID)
    off = analyze_files(HYBRID, DetectorConfig(count_certain_finishes=False))
    assert [f.summary for f in on.findings] == [f.summary for f in off.findings]
    fatal = next(f for f in on.findings if f.kind.value == "engine_fatal")
    lead = fatal.evidence["open_alarm"]["critical_lead_iterations"]
    assert lead >= 10, fatal.summary
    _ev, qi, its, fin = _batch(HYBRID)
    at = int(np.flatnonzero(its == 5)[0])
    over_span, _ = fin.sure_frees(qi[at : at + 1], np.array([80.0]))
    to_crossing, _ = fin.sure_frees(qi[at : at + 1], np.array([40.0 - 5]))
    assert over_span[0] > 0 and to_crossing[0] == 0


def test_with_no_horizon_every_admitted_request_with_a_bound_counts_but_a_suspended_one():
    """At an unbounded horizon the certain pages are those of every admitted request with an
    output budget and a chunk scheduled, except the ones suspended in the target or the draft
    pool (a suspended request makes no progress) -- derived here from the events and the debt's
    per-request track, at the iterations where some admitted request is suspended."""
    path = DATA / "claude-code-rc27-reuse-off.parquet"
    frame = read_frame(path)
    ev, qi, its, fin = _batch(path)
    debt = compute_debt(ev)
    track = debt.track
    track = track[track["pool"] == "draft"]
    kind = frame["kind"].astype(str).to_numpy()
    arrived = frame[kind == "request_arrived"].drop_duplicates("request_id").set_index("request_id")["num_blocks"]
    ends = ev.iteration_ends()
    checked = 0
    for j in np.flatnonzero(np.isin(its, [897, 898, 2908, 2909])):
        q = int(ends[j])
        upto = frame.iloc[: q + 1]
        k = kind[: q + 1]
        rows = track[track["pos"] <= q].groupby("request_id").last()
        rows = rows[rows["is_counted"]]
        sr = upto[np.isin(k, ["suspended", "resumed"]) & upto["pool"].astype(str).isin(["target", "draft"]).to_numpy()]
        last = sr.groupby(["request_id", sr["pool"].astype(str)])["kind"].last().astype(str)
        suspended = {rid for (rid, _pool), kd in last.items() if kd == "suspended"}
        chunked = set(upto[k == "context_chunk_scheduled"]["request_id"])
        want = sum(max(r.held_blocks, r.final_blocks) for rid, r in rows.iterrows()
                   if arrived.get(rid, 0) > 0 and rid in chunked and rid not in suspended)
        pre, dec = fin.sure_frees(qi[j : j + 1], np.array([math.inf]))
        assert pre[0] + dec[0] == want, int(its[j])
        checked += bool(suspended & set(rows.index))
    assert checked  # an admitted request was suspended at one of them at least
