"""``kvscope selfcheck``: record every event kind, write Parquet and JSONL, read both back."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder, read_frame, sink_for_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selfcheck", help="check that recording and replay files work here")
    p.add_argument("--json", action="store_true", help="print one JSON summary object")
    p.set_defaults(func=run)


def selfcheck() -> dict[str, object]:
    """Round-trip every event kind through both file formats; returns a summary dict."""
    rec = Recorder()
    kinds = list(EventKind)
    pools = [p for p in PoolRole if p is not PoolRole.NONE]
    t0 = time.perf_counter_ns()
    for i, kind in enumerate(kinds):
        rec.iteration = i
        rec.record(kind, i, pools[i % len(pools)], i, 64 * i, reason=kind.value)
    record_ns = (time.perf_counter_ns() - t0) / len(kinds)
    out: dict[str, object] = {"kinds": len(kinds), "record_ns_per_event": round(record_ns, 1)}
    with tempfile.TemporaryDirectory() as d:
        paths = [Path(d) / "selfcheck.parquet", Path(d) / "selfcheck.jsonl"]
        sinks = [sink_for_path(p) for p in paths]
        BatchPump(rec, sinks, start=False).shutdown()
        for p in paths:
            df = read_frame(p)
            ok = list(df["kind"].astype(str)) == [k.value for k in kinds]
            out[p.suffix.lstrip(".")] = "ok" if ok else "MISMATCH"
    out["dropped"] = rec.dropped
    out["ok"] = out["parquet"] == "ok" and out["jsonl"] == "ok" and rec.dropped == 0
    return out


def run(args: argparse.Namespace) -> int:
    summary = selfcheck()
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"kvscope selfcheck: {summary['kinds']} event kinds recorded "
            f"({summary['record_ns_per_event']} ns/event incl. first-call warm-up), "
            f"parquet {summary['parquet']}, jsonl {summary['jsonl']}, dropped {summary['dropped']}"
        )
    return 0 if summary["ok"] else 1
