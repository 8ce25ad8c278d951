"""Property-based tests of the engine model and kvscope's effect on it (hypothesis).

Over random configurations (pool and block sizes, reuse on/off, paired/unpaired drafts, engine
version, pp/tp, chunk budgets, batch sizes, draft lengths, host tier, resume threshold, acceptance,
hybrid Gated-DeltaNet targets with their mamba state pool and snapshot interval), random
shared-prefix workloads (some prompts longer than the engine allows) and client cancellations at
random points (before arrival, queued, in context, in generation, suspended, after the end):

* at every executed iteration, in every pool: used + free + evictable = capacity, the occupied
  blocks equal the radix tree's GPU runs plus every cache's private pages, the evictable counter
  equals the blocks in the eviction queue, no block key is owned by two runs; in the mamba state
  pool live + free + snapshots = slots and the live states are exactly the target's caches;
* every request ends (completed, failed with the error, rejected, or cancelled), and a drained
  healthy engine holds no block, no cache and no live mamba state;
* instrumentation never changes an engine decision (same summary, iteration for iteration);
* with remediation: the ledger adds up at every pass, is empty at the end, and with remediation on
  from the start no request reaches a draft or mamba capacity raise site or the deadlock check
  (no engine-fatal).

Shrunk counterexamples are kept below as explicit regression examples (``@example``).
"""

from __future__ import annotations

import pytest
from engine_checks import (
    DecisionLog,
    InvariantLog,
    ListWorkload,
    cancellations,
    check_end,
    check_every_iteration,
    engine_configs,
    workloads,
)
from hypothesis import example, given, note
from hypothesis import strategies as st

from kvscope import replay
from kvscope.app.session import EventFileSession
from kvscope.engines.instrumentor import uninstrument
from kvscope.recording import MemorySink

SOURCE = "near-miss"
"""Only names the run; the configuration and workload are the generated ones."""


@pytest.fixture(autouse=True)
def _uninstrument_after():
    yield
    uninstrument()


class _Handles:
    def __init__(self):
        self.handles = []

    def close(self):
        for h in reversed(self.handles):
            if h is not None and hasattr(h, "close"):
                h.close()
        self.handles = []


def _run(config, requests, cancels, *instruments):
    """One replay of ``requests`` on ``config``; instrumentation (if any) is undone whatever happens,
    so no example leaks hooks into the next."""
    opened = _Handles()

    def instrument(parts):
        for i in instruments:
            opened.handles.append(i(parts))
        return opened

    workload = ListWorkload(list(requests), config.tokens_per_block, list(cancels))
    try:
        return replay.run(SOURCE, config=config, workload=workload, instrument=instrument)
    finally:
        opened.close()
        uninstrument()


def _comparable(summary):
    d = summary.to_dict()
    d.pop("wall_seconds")
    return d


def _stall_case():
    """Shrunk from the example that hung the suite at e0f1721: rc25, two micro-batches, no host tier;
    the scheduler resumes and suspends a request every pass and nothing ever runs (the model ends
    the run as a stall, tests/unit/engine_model/test_stall.py). A cancellation arrives mid-stall."""
    import dataclasses

    from kvscope.engine_model.config import EngineConfig
    from kvscope.workloads.workload import WorkloadRequest

    config = dataclasses.replace(
        EngineConfig(), max_batch_size=2, max_num_tokens=128, max_seq_len=76, tokens_per_block=4,
        enable_block_reuse=False, enable_chunked_prefill=True, max_draft_len=0, max_util_for_resume=1.0,
        pp_size=2, tp_size=1, num_target_blocks=21, num_draft_blocks=200, num_host_blocks=0,
        engine_version="1.3.0rc25", mtp_acceptance_rate=0.0)
    requests = [WorkloadRequest(rid, t, prompt, output, tuple(rid * 1000 + i for i in range(prompt // 4)))
                for rid, t, prompt, output in [(18, 1.45, 51, 10), (19, 1.45, 29, 19), (8, 1.5, 16, 18),
                                               (17, 1.6, 34, 15)]]
    return config, requests, [(3.0, 18)]


@st.composite
def cases(draw):
    config = draw(engine_configs())
    requests = draw(workloads(config))
    return config, requests, draw(cancellations(requests))


@given(cases())
@example(_stall_case())
def test_block_accounting_and_request_ends_hold_at_every_iteration(case):
    config, requests, cancels = case
    log = InvariantLog()
    holder = {}

    def checks(parts):
        holder["parts"] = parts
        check_every_iteration(parts, log)

    summary = _run(config, requests, cancels, checks)
    check_end(holder["parts"], summary, len(requests), log)
    note(f"{summary.requests_total} requests, {log.iterations_checked} iterations, fatal={summary.engine_fatal}")
    assert log.violations == [], log.violations[:5]


@given(cases())
@example(_stall_case())
def test_instrumentation_never_changes_an_engine_decision(case):
    config, requests, cancels = case
    plain_log, recorded_log = DecisionLog(), DecisionLog()
    plain = _run(config, requests, cancels, plain_log)
    sink = MemorySink()
    recorded = _run(config, requests, cancels, lambda parts: EventFileSession(None, extra_sinks=[sink])(parts),
                    recorded_log)
    assert _comparable(recorded) == _comparable(plain)
    assert recorded_log.rows == plain_log.rows  # iteration for iteration
    assert len(sink.events) > 0


MODES = ("off", "shadow", "on", "auto")


@given(cases(), st.lists(st.tuples(st.integers(0, 60), st.sampled_from(MODES)), max_size=4),
       st.sampled_from(MODES))
def test_remediation_ledger_matches_live_requests_and_empties_at_the_end(case, switches, first_mode):
    from kvscope.app.remedy import RemediatedSession

    config, requests, cancels = case
    log = InvariantLog()
    holder = {}
    session = RemediatedSession(mode=first_mode, switch_at=sorted(switches))

    def checks(parts):
        holder["parts"] = parts
        check_every_iteration(parts, log)
        ctl = session.controller
        policy = getattr(ctl, "_policy", None)

        def check_ledger(_iteration):
            ledger = getattr(policy, "ledger", None)
            if ledger is not None:
                ledger.check()  # totals == sum of reservations
                live = {r.request_id for r in parts.executor.active_requests}
                stale = [rid for rid in ledger.request_ids() if rid not in live]
                if stale and ctl.enforcing:
                    log.violations.append(f"reservations of requests no longer live: {stale[:5]}")

        ctl.pass_hooks.append(check_ledger)

    summary = _run(config, requests, cancels, session, checks)
    stats = session.final_stats
    check_end(holder["parts"], summary, len(requests), log)
    if not summary.engine_stalled:  # a stall stops with requests (and their reservations) live
        assert stats.get("live_reservations", 0) == 0, stats
    assert stats.get("policy_errors", 0) == 0, stats
    if first_mode == "on" and not switches and not summary.engine_stalled:
        # Enforcing throughout: every reservation made was released (no leak). Shadow and mode
        # changes are the known regressions below.
        assert stats.get("reservations_made", 0) == stats.get("reservations_released", 0), stats
    if first_mode == "on" and not switches:
        assert not summary.engine_fatal, summary.fatal_message
    assert log.violations == [], log.violations[:5]


# Found by this suite, fixed in remediation since: shadow mode kept a reservation of a request it
# "would defer" (reservations_made > released at the end of a drained run).
@given(cases())
def test_shadow_mode_releases_every_reservation_it_makes(case):
    from kvscope.app.remedy import RemediatedSession

    config, requests, cancels = case
    session = RemediatedSession(mode="shadow")
    summary = _run(config, requests, cancels, session)
    stats = session.final_stats
    if not summary.engine_stalled:  # a stall stops with requests (and their reservations) live
        assert stats["reservations_made"] == stats["reservations_released"], stats
