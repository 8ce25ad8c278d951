"""The file export service behind ``kvscope export EVENTS...``: each recorded event file replayed into
OTLP through :class:`kvscope.otel.OtelSink` with its ORIGINAL timestamps, the batch analyzer's
findings and gauges laid out on the event clock beside it.

Each file (one per rank) gets its own pipeline and resource (service, engine, version, rank, pp/tp
position from its header). Export never blocks on the collector for long: telemetry that cannot be
sent in time is dropped and counted in the summary :func:`export_files` returns. The command
(:mod:`kvscope.commands.export`) checks its flags and reports that summary and its exit status; the
live counterpart (``--follow``) is :mod:`kvscope.app.follow`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvscope.events import WallClockAnchor
from kvscope.otel import OtelSink, OtlpConfig, OtlpPipeline, kvscope_resource
from kvscope.otel.analyzer_bridge import AnalysisTimeline, PoolTimeline, TimelineBridge
from kvscope.recording import EventBatch, read_file
from kvscope.recording.reader import frame_to_rows

BATCH_ROWS = 4096
REPLAY_MAX_BLOCK_S = 10.0
"""A replay waits up to this long for room in a full export queue while the collector answers
(a file is not an engine: pacing it loses nothing); once an export fails it stops waiting."""


def export_files(
    paths: Sequence[str],
    config: OtlpConfig,
    *,
    service_name: str | None = None,
    metric_interval_s: float = 1.0,
    shutdown_timeout_s: float = 5.0,
    max_queue_size: int = 2048,
    on_progress: Callable[[int], None] | None = None,
    analyze: bool = True,
) -> dict[str, Any]:
    """Replay each file into OTLP; returns the summary (see :meth:`OtelSink.summary`) summed over files.

    ``on_progress(num_events_so_far)`` is called after each batch (tests use it to break the
    collector mid-replay). With ``analyze`` the batch analyzer (the one ``kvscope analyze`` runs)
    reads the file first: its findings become log records and its draft debt, time to exhaustion
    and alarm level become gauges along the event timeline (one value per metric snapshot).
    """
    from kvscope.app.inputs import load_checked

    total: dict[str, Any] = {}
    files = []
    warnings: list[str] = []
    done = 0
    for path in paths:
        # Partial input as `kvscope analyze` takes it: what is readable is exported, what is not is
        # said (one line per file, on stderr from run()) and makes the export exit 1.
        df, facts = load_checked([path], read_file, work="exported")
        warning = facts.warning()
        if warning:
            warnings.append(warning if facts.empty else f"{path}: {warning}")  # that one names the file
        header = df.attrs["kvscope"]["files"][0]["header"] or {}
        anchor = WallClockAnchor.from_dict(header["anchor"])
        meta = header.get("meta") or {}
        rows = frame_to_rows(df)
        pipeline = OtlpPipeline(
            config,
            resource=kvscope_resource(meta, service_name=service_name),
            shutdown_timeout_s=shutdown_timeout_s,
            max_queue_size=max_queue_size,
            max_batch_size=min(512, max_queue_size),
            max_block_s=REPLAY_MAX_BLOCK_S,
        )
        sink = OtelSink(
            **pipeline.sink_options(),
            threaded=False,
            metric_interval_s=metric_interval_s,
            shutdown_timeout_s=shutdown_timeout_s,
        )
        bridge = _attach_analysis(sink, df) if analyze else None
        del df
        for i in range(0, len(rows), BATCH_ROWS):
            sink.export(EventBatch.from_rows(rows[i : i + BATCH_ROWS], anchor))
            done += len(rows[i : i + BATCH_ROWS])
            if on_progress is not None:
                on_progress(done)
        sink.shutdown()
        pipeline.shutdown()
        s = sink.summary()
        s["findings"] = bridge.num_findings if bridge is not None else 0
        files.append(
            {
                "path": str(path),
                "rank": int(meta.get("rank", anchor.rank)),
                "events": s["events"],
                "dropped_total": s["dropped_total"],
                "complete": facts.complete,
            }
        )
        _add(total, s)
    total["files"] = files
    total["input_warnings"] = warnings
    total["endpoint"] = config.endpoint
    total["protocol"] = config.protocol
    total["exported_total"] = sum(
        total.get(k, {}).get("exported", 0) for k in ("spans", "logs", "metric_points")
    )
    return total


def _attach_analysis(sink: OtelSink, frame: Any) -> TimelineBridge | None:
    """The batch analyzer (the one ``kvscope analyze`` runs) over the whole file, its findings and
    gauges laid out on the event clock for the sink."""
    try:
        from kvscope.analysis import analyze as run_analyzer
    except ImportError:  # analyzer not available in this build: export without findings
        return None
    return TimelineBridge(sink, timeline_of(run_analyzer(frame)))


def timeline_of(analysis: Any, pools: Sequence[str] = ("target", "draft")) -> AnalysisTimeline:
    """An :class:`~kvscope.analysis.Analysis` as an export timeline: the debt at every consistent
    point, the time to exhaustion per iteration end, and each warning/critical finding about a pool
    as an alarm interval (a time-to-exhaustion episode is a warning until ``critical_at_s``)."""
    from kvscope.analysis.incidents import EXHAUSTION_KINDS, alarm_intervals

    series = analysis.debt.series
    ex = analysis.exhaustion
    out = {}
    for pool in pools:
        d = series[series["pool"] == pool]
        e = ex[ex["pool"] == pool] if not ex.empty else ex
        if d.empty:
            continue
        alarms = [(int(a * 1e9), int(b * 1e9), lv) for a, b, lv in alarm_intervals(
            analysis.findings, pool, stall_warn_s=analysis.config.stall_warn_s)]
        risk = [(int(a * 1e9), int(b * 1e9), lv)
                for a, b, lv in alarm_intervals(analysis.findings, pool, kinds=EXHAUSTION_KINDS)]
        out[pool] = PoolTimeline(
            debt_ts_ns=d["ts_ns"].to_numpy(np.int64), debt_blocks=d["debt_blocks"].to_numpy(float),
            eta_ts_ns=e["ts_ns"].to_numpy(np.int64) if len(e) else np.zeros(0, np.int64),
            eta_s=e["eta_s"].to_numpy(float) if len(e) else np.zeros(0),
            alarms=tuple(alarms), risk=tuple(risk))
    return AnalysisTimeline(findings=tuple(analysis.findings), pools=out)


def _add(acc: dict[str, Any], s: dict[str, Any]) -> None:
    for k, v in s.items():
        if isinstance(v, dict):
            _add(acc.setdefault(k, {}), v)
        elif k == "high_water":
            acc[k] = max(acc.get(k, 0), v)
        else:
            acc[k] = acc.get(k, 0) + v
