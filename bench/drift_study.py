"""Could a longer view of the draft pool's growth foresee the crashes the analyzer does not?

Reads the event files a corpus run left (``python bench/corpus.py --out DIR``) and asks, of every
unpaired run, a rule simpler than the analyzer's: the draft pool's net growth over the trailing
``W`` iterations, extrapolated, reaches its resume ceiling within ``K`` iterations while requests
wait. For each (W, K) it prints how many crashes that rule would give a critical 10 to 60
iterations before the failure, how many of the analyzer's misses among them, and on how many
healthy runs it would be critical at least once (it must be none).

    .venv/bin/python bench/drift_study.py DIR [--misses NAME ...]

Session 21 ran it over the 126-run corpus: every (W, K) that reaches the missed crashes is also
critical on most healthy runs (bench/RESULTS.md, "A longer trend does not separate them").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ["iteration", "pool", "kind", "capacity_blocks", "free_blocks", "evictable_blocks", "reason", "request_id"]
WINDOWS = ((32, 16), (32, 32), (64, 32), (64, 64), (128, 64), (128, 128))


def study_run(path: Path) -> dict | None:
    """Per (W, K): for a crash, the first iteration 10 to 60 before the failure where the rule
    holds (its lead); for a healthy run, the iterations where it holds. None for a paired or
    draft-less run."""
    df = pd.read_parquet(path, columns=COLUMNS)
    kind, pool = df["kind"].astype(str), df["pool"].astype(str)
    cfg = df[(kind == "pool_configured") & (pool == "draft")]
    if cfg.empty or "paired=1" in cfg["reason"].iloc[0]:
        return None
    ceiling = float(cfg["reason"].iloc[0].split("max_util_for_resume=")[1].split()[0])
    snaps = df[(kind == "pool_snapshot") & (pool == "draft")].groupby("iteration").last()
    its = snaps.index.to_numpy()
    cap = snaps["capacity_blocks"].to_numpy(float)
    used = cap - snaps["free_blocks"].to_numpy() - snaps["evictable_blocks"].to_numpy()
    room = np.maximum(ceiling * cap - used, 0.0)
    failed = df[kind == "engine_failed"]
    fatal = int(failed["iteration"].iloc[0]) if len(failed) else None
    arrived = np.sort(df[kind == "request_arrived"].groupby("request_id")["iteration"].min().to_numpy())
    admitted = df[kind == "admitted"].groupby("request_id")["iteration"].min()
    left = np.sort(admitted.reindex(df[kind == "request_arrived"]["request_id"].unique()).fillna(np.inf).to_numpy())
    waiting = np.searchsorted(arrived, its, "right") - np.searchsorted(left, its, "right")
    out: dict = {"run": path.name[: -len(".parquet")], "fatal_iteration": fatal}
    for w, k in WINDOWS:
        back = np.searchsorted(its, its - w)
        span = its - its[back]
        rate = np.where(span > 0, (used - used[back]) / np.maximum(span, 1), 0.0)
        closing = np.where(rate > 0, room / np.where(rate > 0, rate, 1.0), np.inf)
        holds = (closing <= k) & (waiting >= 2) & (span >= w // 2)
        if fatal is None:
            out[f"W{w}K{k}"] = int(holds.sum())
        else:
            lead = its[holds & (its >= fatal - 60) & (its <= fatal - 10)]
            out[f"W{w}K{k}"] = int(fatal - lead[0]) if len(lead) else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="a corpus --out directory")
    ap.add_argument("--misses", nargs="*", default=(), help="file stems of the crashes the analyzer misses")
    ap.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    args = ap.parse_args()
    files = sorted(p for p in Path(args.dir).glob("*.parquet") if ".twin-" not in p.name)
    if not files:
        raise SystemExit(f"{args.dir}: no event files (run bench/corpus.py --out {args.dir} first)")
    rows = [r for r in map(study_run, files) if r is not None]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    crashes = [r for r in rows if r["fatal_iteration"] is not None]
    healthy = [r for r in rows if r["fatal_iteration"] is None]
    print(f"{len(rows)} unpaired runs: {len(crashes)} crashes, {len(healthy)} healthy")
    print(f"{'rule':<10}{'crashes 10-60 it ahead':>24}{'misses among them':>19}{'healthy runs critical':>23}")
    for w, k in WINDOWS:
        key = f"W{w}K{k}"
        caught = [r for r in crashes if r[key] is not None]
        misses = [r for r in caught if r["run"] in set(args.misses)]
        false = [r for r in healthy if r[key] > 0]
        print(f"{key:<10}{len(caught):>17} of {len(crashes):<4}{len(misses):>19}{len(false):>16} of {len(healthy)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
