"""Instrumenting never changes the engine: same summary (except wall_seconds) and the same decisions."""

from __future__ import annotations

from kvscope.app.session import instrument_replay
from kvscope.events import EventKind
from kvscope.recording import read_frame
from kvscope.replay import run


class DecisionLog:
    """Records every scheduling decision of one replay (an instance-level observer, the same in both
    runs, so it cannot make them differ)."""

    def __init__(self, session=None):
        self.session = session
        self.decisions: list[tuple] = []

    def __call__(self, parts):
        scheduler = parts.scheduler
        schedule = scheduler.schedule_request

        def logged(active_requests, inflight_request_ids):
            out = schedule(active_requests, inflight_request_ids)
            self.decisions.append((parts.executor.iter_counter,
                                   tuple((r.py_request_id, r.context_current_position, r.context_chunk_size)
                                         for r in out.context_requests),
                                   tuple(r.py_request_id for r in out.generation_requests),
                                   tuple(r.py_request_id for r in out.paused_requests)))
            return out

        scheduler.schedule_request = logged
        return self.session(parts) if self.session is not None else None


def test_instrumented_and_plain_replays_agree_when_the_same_scenario_and_seed_run(tmp_path):
    plain = DecisionLog()
    summary_plain = run("shared-prefix", instrument=plain).to_dict()
    path = tmp_path / "events.jsonl"
    observed = DecisionLog(instrument_replay(str(path), label="shared-prefix"))
    summary_observed = run("shared-prefix", instrument=observed).to_dict()
    summary_plain.pop("wall_seconds")
    summary_observed.pop("wall_seconds")
    assert summary_observed == summary_plain
    assert observed.decisions == plain.decisions and len(plain.decisions) > 10
    frame = read_frame(path)
    assert summary_plain["engine_fatal"] is True
    fatal = frame[frame["kind"] == EventKind.ENGINE_FAILED.value].iloc[0]
    assert int(fatal["request_id"]) == summary_plain["fatal_request_id"]
    assert fatal["pool"] == "draft"
    # The analyzer can see, for the request that died, the draft allocation that failed.
    failed = frame[(frame["kind"] == EventKind.RESIZE_FAILED.value) & (frame["request_id"] == fatal["request_id"])]
    assert failed["pool"].tolist() == ["draft"]
    assert int(failed["num_tokens"].iloc[0]) == int(fatal["num_tokens"])


def test_replay_events_are_refused_when_the_model_is_already_instrumented(tmp_path):
    import pytest

    from kvscope.engines.instrumentor import instrument
    from kvscope.recording import Recorder

    instrument(recorder=Recorder(), engine="model")
    with pytest.raises(ValueError, match="already instrumented"):
        run("shared-prefix", instrument=instrument_replay(str(tmp_path / "x.jsonl"), label="shared-prefix"))
