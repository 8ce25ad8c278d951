"""Peak utilisation has one definition everywhere: the replay summary's ``peak_utilization``, the
maximum of the event file's POOL_SNAPSHOT utilisation and the maximum of the exported
``kvscope.pool.utilization`` gauge (``kvscope_pool_utilization_ratio``) are the same number on a run
that crashes, failing iteration included (the summary used to stop at the last completed one).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from kvscope.analysis.frame import pool_series
from kvscope.events import WallClockAnchor
from kvscope.otel import OtelSink
from kvscope.otel import names as n
from kvscope.recording import read_file, read_frame
from kvscope.recording.reader import frame_to_rows
from kvscope.recording.sinks import EventBatch

pytestmark = pytest.mark.slow


class _KeepMetrics(MetricExporter):
    """Keeps every pushed MetricsData (the export path's own event-time snapshots)."""

    def __init__(self) -> None:
        super().__init__()
        self.data: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.data.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        return None


def _exported_utilization_max(path) -> dict[str, float]:
    """Replay the file through an OtelSink as ``kvscope export`` does; the gauge's highest value per pool."""
    df = read_file(path)
    anchor = WallClockAnchor.from_dict(df.attrs["kvscope"]["files"][0]["header"]["anchor"])
    rows = frame_to_rows(df)
    keep = _KeepMetrics()
    sink = OtelSink(metric_exporter=keep, threaded=False)
    for i in range(0, len(rows), 4096):
        sink.export(EventBatch.from_rows(rows[i : i + 4096], anchor))
    sink.shutdown()
    peak: dict[str, float] = {}
    for data in keep.data:
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != n.POOL_UTILIZATION.name:
                        continue
                    for p in m.data.data_points:
                        pool = str(p.attributes[n.POOL])
                        peak[pool] = max(peak.get(pool, 0.0), float(p.value))
    return peak


@pytest.fixture(scope="module")
def crash(tmp_path_factory):
    path = tmp_path_factory.mktemp("peak") / "glm5.parquet"
    # Sessions 1.19 s apart: the first 64 requests crash in the start-up burst (on the default 10 s
    # ramp the engine serves them without a crash).
    res = subprocess.run(
        [sys.executable, "-m", "kvscope", "replay", "--scenario", "glm5-dsa", "--set", "max_requests=64",
         "--set", "session_start_interval_s=-1", "--events", str(path), "--json"],
        capture_output=True, text=True, timeout=600, check=True)
    return json.loads(res.stdout), path


def test_summary_peak_equals_snapshot_max_and_exported_gauge_max_on_a_crash(crash):
    summary, path = crash
    assert summary["engine_fatal"], summary
    snaps = pool_series(read_frame(path))
    snapshot_max = {str(p): float(g.max()) for p, g in snaps.groupby("pool", observed=True)["utilization"]}
    exported_max = _exported_utilization_max(path)
    assert set(summary["peak_utilization"]) == set(snapshot_max) == set(exported_max) == {"target", "draft"}
    for pool, peak in summary["peak_utilization"].items():
        assert peak == pytest.approx(snapshot_max[pool], abs=1e-6), pool
        assert peak == pytest.approx(exported_max[pool], abs=1e-6), pool
    # the failing iteration is counted: the draft pool died above the resume ceiling
    assert summary["peak_utilization"]["draft"] > 0.95


def test_the_failing_iteration_holds_the_peak(crash):
    """The state the engine died in (the snapshot after ENGINE_FAILED) is part of the peak."""
    summary, path = crash
    ev = read_frame(path)
    fatal_pos = int((ev["kind"] == "engine_failed").to_numpy().nonzero()[0][0])
    after = pool_series(ev.iloc[fatal_pos:])
    at_fatal = {str(p): float(g.iloc[0]) for p, g in after.groupby("pool", observed=True)["utilization"]}
    for pool, value in at_fatal.items():
        assert summary["peak_utilization"][pool] >= value - 1e-6
    assert summary["peak_utilization"]["draft"] == pytest.approx(at_fatal["draft"], abs=1e-6)
