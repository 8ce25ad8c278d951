"""Analyzer throughput: events analyzed per second, end to end from a Parquet file to findings.

End to end is ``analyze_files(path)``: the Parquet file read straight into the analyzer's column
view, every detector, the findings. A large replay is built by concatenating copies of a real replay's event file (the Mooncake
conversation trace on the glm5-dsa engine model, `kvscope replay --events`): each copy shifted in
time, iteration and request ids, so the stream looks like one long run. It is analyzed at 1x, 2x
and 4x that size, and compared side by side with a floor: a plain vectorized pandas pass (read +
cumulative pool usage + per-request and per-iteration group-bys) over the same file.

    .venv/bin/python bench/bench_analyzer.py [--events-1x N] [--source PATH]

Target: >= 3 million events/s end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvscope.analysis import analyze_files
from kvscope.analysis.loader import load_events
from kvscope.events import EVENT_KINDS, FIELDS, POOL_ROLES
from kvscope.recording import read_frame
from kvscope.recording.files import HEADER_KEY, arrow_schema


def source_replay(tmp: Path) -> Path:
    path = tmp / "source.parquet"
    cmd = [sys.executable, "-m", "kvscope", "replay", "--scenario", "mooncake-conversation",
           "--set", "max_requests=400", "--json", "--events", str(path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return path


def write_repeated(src: pd.DataFrame, header: bytes, n_events: int, path: Path) -> int:
    """Concatenate shifted copies of ``src`` until ``n_events``; write Parquet; return the count."""
    base = src[src["kind"] != "pool_configured"].reset_index(drop=True)
    head = src[src["kind"] == "pool_configured"]
    span_ns = int(base["ts_ns"].max() - base["ts_ns"].min()) + 1_000_000_000
    span_it = int(base["iteration"].max()) + 1
    span_rid = int(base["request_id"].max()) + 1
    copies = max(1, int(np.ceil((n_events - len(head)) / len(base))))
    schema = arrow_schema().with_metadata({HEADER_KEY: header})
    kind_idx = {k.value: i for i, k in enumerate(EVENT_KINDS)}
    pool_idx = {p.value: i for i, p in enumerate(POOL_ROLES)}
    kinds = pa.array([k.value for k in EVENT_KINDS], pa.string())
    pools = pa.array([p.value for p in POOL_ROLES], pa.string())
    written = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        for c in range(copies + 1):
            part = head if c == 0 else base.copy()
            if c > 0:
                part["ts_ns"] += (c - 1) * span_ns
                part["iteration"] = np.where(part["iteration"] >= 0, part["iteration"] + (c - 1) * span_it, -1)
                part["request_id"] = np.where(part["request_id"] >= 0, part["request_id"] + (c - 1) * span_rid, -1)
                if written + len(part) > n_events:
                    part = part.iloc[: n_events - written]
            arrays = []
            for f in FIELDS:
                col = part[f]
                if f in ("kind", "pool"):
                    idx = col.astype(str).map(kind_idx if f == "kind" else pool_idx).to_numpy(np.int8)
                    arrays.append(pa.DictionaryArray.from_arrays(pa.array(idx), kinds if f == "kind" else pools))
                elif f == "reason":
                    arrays.append(pa.array(col.astype(object).fillna("").tolist(), pa.string()))
                else:
                    arrays.append(pa.array(col.to_numpy(), schema.field(f).type))
            w.write_table(pa.Table.from_arrays(arrays, schema=schema), row_group_size=1 << 20)
            written += len(part)
            if written >= n_events:
                break
    return written


def layouts(src_path: Path, tmp: Path, repeat: int) -> list[dict]:
    """The source replay's events in two Parquet layouts: row groups of 48 rows (a real engine's
    pump batch, one row group each: a sink that writes each batch as its own group) and of
    ``ROW_GROUP_ROWS`` (what the Parquet sink writes). ``analyze_files`` and ``read_file`` events/s on each."""
    from kvscope.recording import read_file
    from kvscope.recording.files import ROW_GROUP_ROWS

    pf = pq.ParquetFile(src_path)
    table = pf.read().replace_schema_metadata(pf.schema_arrow.metadata)
    out = []
    for rows_per_group in (48, ROW_GROUP_ROWS):
        path = tmp / f"layout{rows_per_group}.parquet"
        pq.write_table(table, path, row_group_size=rows_per_group, compression="zstd")
        t_a, (n_ev, n_find) = best_of(end_to_end, path, repeat)
        t_r, _ = best_of(read_file, path, repeat)
        out.append({"rows_per_group": rows_per_group, "row_groups": pq.ParquetFile(path).num_row_groups,
                    "events": n_ev, "findings": n_find, "analyze_events_per_s": round(n_ev / t_a),
                    "read_events_per_s": round(n_ev / t_r)})
    return out


def floor_pass(path: Path) -> int:
    """The plain vectorized pandas pass the issue names as ~4M events/s on this machine: read
    (the same fast loader), cumulative pool usage, per-request and per-iteration group-bys."""
    df = load_events(path)
    state = df[df["capacity_blocks"] >= 0]
    used = (state["capacity_blocks"] - state["free_blocks"] - state["evictable_blocks"]).groupby(
        state["pool"], observed=True).cumsum()
    per_req = df[df["request_id"] >= 0].groupby(["request_id", "kind"], observed=True)["num_tokens"].agg(["size", "sum"])
    per_it = df.groupby("iteration")["num_tokens"].agg(["size", "sum"])
    return len(df) + len(used) * 0 + len(per_req) * 0 + len(per_it) * 0


def end_to_end(path: Path) -> tuple[int, int]:
    a = analyze_files(path)
    return a.num_events, len(a.findings)


def best_of(fn, path: Path, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(path)
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events-1x", type=int, default=2_000_000, help="events at 1x (default 2M)")
    ap.add_argument("--source", help="event file to repeat (default: a fresh Mooncake replay)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per size; the best is kept")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src_path = Path(args.source) if args.source else source_replay(tmp)
        src = read_frame(src_path)
        header = pq.ParquetFile(src_path).schema_arrow.metadata[HEADER_KEY]
        rows = []
        for mult in (1, 2, 4):
            path = tmp / f"big{mult}.parquet"
            n = write_repeated(src, header, args.events_1x * mult, path)
            t_floor, _ = best_of(floor_pass, path, args.repeat)
            t_e2e, (n_ev, n_find) = best_of(end_to_end, path, args.repeat)
            rows.append({"scale": f"{mult}x", "events": n_ev, "findings": n_find,
                         "analyze_s": round(t_e2e, 3), "events_per_s": round(n_ev / t_e2e),
                         "floor_s": round(t_floor, 3), "floor_events_per_s": round(n / t_floor),
                         "analyze_over_floor": round(t_e2e / t_floor, 2),
                         "file_mb": round(os.path.getsize(path) / 2**20, 1)})
            os.remove(path)
        layout = layouts(src_path, tmp, args.repeat)
    base = rows[0]["analyze_s"]
    for r in rows:
        r["time_vs_1x"] = round(r["analyze_s"] / base, 2)
    # Other jobs share the machine's cores: the load average says how quiet the run was.
    load = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps({"rows": rows, "layouts": layout, "target_events_per_s": 3_000_000, "load_avg_1_5_15": load,
                          "cpu_count": os.cpu_count()}))
        return 0
    print(f"source: {len(src)} events repeated; target >= 3,000,000 events/s end to end; "
          f"load average {load} on {os.cpu_count()} cores")
    print(f"{'scale':>5} {'events':>10} {'findings':>8} {'analyze s':>10} {'events/s':>12} "
          f"{'floor s':>8} {'floor ev/s':>12} {'x floor':>8} {'t vs 1x':>8} {'MB':>6}")
    for r in rows:
        print(f"{r['scale']:>5} {r['events']:>10,} {r['findings']:>8} {r['analyze_s']:>10.3f} "
              f"{r['events_per_s']:>12,} {r['floor_s']:>8.3f} {r['floor_events_per_s']:>12,} "
              f"{r['analyze_over_floor']:>8.2f} {r['time_vs_1x']:>8.2f} {r['file_mb']:>6}")
    print("the source replay as a recording's Parquet layout (row groups of one pump batch, "
          "and of up to 65,536 rows as the Parquet sink writes):")
    for r in layout:
        print(f"  {r['rows_per_group']:>6} rows per group ({r['row_groups']:>5} groups, {r['events']:,} events): "
              f"analyze_files {r['analyze_events_per_s']:>10,} events/s, read_file {r['read_events_per_s']:>10,} events/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
