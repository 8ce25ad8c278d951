"""A loop that would spin without end is ended and reported as a stall, never run forever.

The input below is a shrunk hypothesis counterexample (it hung the suite at e0f1721): on 1.3.0rc25
with two pipeline micro-batches, no host tier and a 21-block target pool, two generating requests
cannot both grow. Every pass the scheduler resumes one, cannot grow it and suspends it again;
rc25's deadlock check counts that suspension as progress, so nothing raises and nothing runs. The
real rc25 ``scheduler_v2.py`` makes the same decisions on this input (../shared/tools/real-scheduler,
chunked prefill on, 5,000 passes compared); 00746ef serves it to the end.
"""

from __future__ import annotations

import pytest
from test_executor import ListWorkload, make_config, make_request

from kvscope import replay
from kvscope.engine_model import executor as executor_module

# max_util_for_resume 1.0: with the default 0.95 the same pool fails resumes outright and rc25 raises its
# deadlock error instead (engine fatal).
ARRIVALS = [(18, 1.45, 51, 10), (19, 1.45, 29, 19), (8, 1.5, 16, 18), (17, 1.6, 34, 15)]


def _config(engine_version: str):
    return make_config(max_batch_size=2, max_num_tokens=128, max_seq_len=76, tokens_per_block=4,
                       enable_block_reuse=False, enable_chunked_prefill=True, max_draft_len=0,
                       pp_size=2, num_target_blocks=21, num_draft_blocks=200, num_host_blocks=0,
                       max_util_for_resume=1.0, mtp_acceptance_rate=0.0, engine_version=engine_version)


def _requests():
    return [make_request(rid, prompt, output, arrival_s=t, tokens_per_block=4)
            for rid, t, prompt, output in ARRIVALS]


class _Cancelling(ListWorkload):
    def __init__(self, requests, tokens_per_block, cancels):
        super().__init__(requests, tokens_per_block)
        self.cancels = sorted(cancels)

    def pop_cancellations(self, now_s):
        due = [rid for t, rid in self.cancels if t <= now_s]
        self.cancels = [(t, rid) for t, rid in self.cancels if t > now_s]
        return due


def _run(engine_version: str, cancels=()):
    config = _config(engine_version)
    workload = _Cancelling(_requests(), config.tokens_per_block, list(cancels))
    return replay.run("near-miss", config=config, workload=workload)


def test_the_rc25_suspend_resume_livelock_ends_as_a_reported_stall_not_a_hang():
    summary = _run("1.3.0rc25")
    assert summary.engine_stalled
    assert not summary.engine_fatal and summary.healthy  # the real loop is alive; it serves nothing
    assert summary.requests_completed == 0 and summary.requests_unfinished == len(ARRIVALS)
    assert summary.requests_total == len(ARRIVALS)
    # Nothing ran for both bounds, and not much longer: the run ends at the first iteration past them.
    assert summary.sim_seconds >= 1.45 + executor_module.STALL_LIMIT_S
    assert summary.sim_seconds < 1.45 + executor_module.STALL_LIMIT_S + 5
    message = summary.stall_message
    assert message.startswith("Engine stalled: nothing scheduled or executed in ")
    assert "2 in generation, 2 waiting" in message
    assert "suspended a request" in message and "counts as progress" in message
    assert summary.to_dict()["engine_stalled"] is True


def test_a_cancellation_sent_during_the_stall_stays_pending_and_the_report_says_so():
    summary = _run("1.3.0rc25", cancels=[(3.0, 18)])
    assert summary.engine_stalled and summary.requests_cancelled == 0
    assert "1 cancellation(s) stay pending: only an iteration that runs a batch applies them" in (
        summary.stall_message)


def test_the_same_input_on_00746ef_is_served_to_the_end():
    summary = _run("main-00746ef")
    assert not summary.engine_stalled and summary.stall_message is None
    assert summary.requests_completed == len(ARRIVALS) and summary.requests_unfinished == 0


@pytest.mark.parametrize("limit_s", [2.0, 8.0])
def test_the_stall_bound_is_simulated_time_and_iterations_both(monkeypatch, limit_s):
    monkeypatch.setattr(executor_module, "STALL_LIMIT_S", limit_s)
    summary = _run("1.3.0rc25")
    assert summary.engine_stalled
    # 2,000 idle iterations of 1 ms are 2 s: the longer of the two bounds decides.
    idle_s = max(limit_s, executor_module.STALL_LIMIT_ITERATIONS * executor_module.IDLE_ITERATION_S)
    assert 1.45 + idle_s <= summary.sim_seconds < 1.45 + idle_s + 5
