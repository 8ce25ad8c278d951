"""``kvscope export --follow`` end to end: a real replay of the engine model publishes its live
stream; a follower (another thread here, another process in use) decodes the binary batches and
exports them to the real collector -> Phoenix (traces) and VictoriaMetrics (metrics)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from otel_stack import poll

from kvscope import replay
from kvscope.app.follow import follow
from kvscope.app.session import EventFileSession
from kvscope.engines.live import ZmqPublisherSink
from kvscope.otel import OtlpConfig
from kvscope.otel import names as n
from kvscope.recording import read_file

pytestmark = pytest.mark.integration


def _follow_in_thread(pub: ZmqPublisherSink, otel_stack, service: str) -> tuple[threading.Thread, dict]:
    """``follow`` of ``pub``'s stream on a thread (its summary lands in the dict), once it has
    subscribed: nothing is published before it joins."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(follow(
        pub.endpoint, OtlpConfig(otel_stack.http_endpoint, "http/protobuf"), service_name=service,
        idle_exit_s=60)))
    t.start()
    deadline = time.monotonic() + 30
    while pub.num_subscribers == 0 and time.monotonic() < deadline:
        pub._drain_subscriptions()
        time.sleep(0.05)
    return t, out


def test_a_replays_live_stream_reaches_the_backends_whole_when_followed(otel_stack, tmp_path, monkeypatch):
    run = uuid.uuid4().hex[:8]
    service, project = f"follow-{run}", f"follow-{run}"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={project}")
    pub = ZmqPublisherSink("tcp://127.0.0.1:*", high_water_mark=100_000)
    t, out = _follow_in_thread(pub, otel_stack, service)
    path = tmp_path / "shared-prefix.parquet"
    replay.run("shared-prefix", instrument=EventFileSession(path, label="shared-prefix", extra_sinks=[pub]))
    t.join(timeout=120)  # the session's close shut the publisher down: its END ends the follow
    assert not t.is_alive()

    df = read_file(path)
    stream = out["stream"]
    assert stream["ended"] and stream["run_id"] == pub.run_id
    assert out["events"] == stream["events"] == pub.num_sent_events == len(df)
    assert stream["gap_events"] == stream["missed_at_start"] == stream["publisher_dropped"] == 0
    assert out["dropped_total"] == 0

    num_requests = int((df["kind"] == "request_arrived").sum())
    fatal = df[df["kind"] == "engine_failed"].iloc[0]
    reqs = otel_stack.phoenix_request_spans(project, num_requests, 60)
    assert len(reqs) == num_requests == out["requests"]["started"], otel_stack.diagnose()
    trigger = reqs[int(fatal["request_id"])]
    assert trigger["status_code"] == "ERROR"
    assert n.EV_ENGINE_FAILED in [e["name"] for e in trigger["events"]]

    reused = df[df["kind"] == "blocks_reused"].groupby("pool", observed=True)["num_tokens"].sum().to_dict()
    last_s = int(df["epoch_ns"].max()) / 1e9

    def value(metric, **labels):
        return otel_stack.vm_value(metric, service=service, at_s=last_s, **labels)

    assert poll(lambda: value("kvscope_engine_failures_total", kvscope_pool="draft") == 1)
    assert poll(lambda: value("kvscope_prefix_cache_hits_total", kvscope_pool="target") == reused["target"])


def test_a_followed_rank_is_labelled_with_its_rank_and_engine_as_its_file_export_would_be(otel_stack, tmp_path):
    """A follower of rank 1 of a pp=2 engine exports under rank 1, with the engine's name, version and
    layout (from the stream's header), not under a bare rank 0 where rank 0's follower exports too."""
    from kvscope.events import WallClockAnchor
    from kvscope.recording.reader import frame_to_rows
    from kvscope.recording.sinks import EventBatch

    path = tmp_path / "shared-prefix.parquet"
    replay.run("shared-prefix", instrument=EventFileSession(path, label="shared-prefix"))
    df = read_file(path)
    header = df.attrs["kvscope"]["files"][0]["header"]
    service = f"follow-rank-{uuid.uuid4().hex[:8]}"
    meta = {"engine": "tensorrt_llm", "engine_version": "1.3.0rc25", "tp_size": 1, "pp_size": 2,
            "argv": ["trtllm-serve"], "run_id": "x"}
    pub = ZmqPublisherSink("tcp://127.0.0.1:*", high_water_mark=100_000, meta=meta)
    t, out = _follow_in_thread(pub, otel_stack, service)
    anchor = WallClockAnchor.from_dict(header["anchor"])
    rows = frame_to_rows(df)
    for i in range(0, len(rows), 512):
        batch = EventBatch.from_rows(rows[i : i + 512], anchor)
        batch.rank = 1
        pub.export(batch)
    pub.shutdown()  # its END ends the follow
    t.join(timeout=120)
    assert not t.is_alive() and out["stream"]["ended"] and out["events"] == len(df)

    last_s = int(df["epoch_ns"].max()) / 1e9

    def labels():
        got = otel_stack.vm_query(f'kvscope_engine_failures_total{{service_name="{service}",kvscope_pool="draft"}}',
                                  at_s=last_s)
        return got[0]["metric"] if len(got) == 1 else None

    assert poll(lambda: labels() is not None), otel_stack.diagnose()
    got = labels()
    assert (got["kvscope_rank"], got["kvscope_parallel_pp_rank"], got["kvscope_parallel_pp_size"]) == ("1", "1", "2")
    assert (got["kvscope_engine_name"], got["kvscope_engine_version"]) == ("tensorrt_llm", "1.3.0rc25")
