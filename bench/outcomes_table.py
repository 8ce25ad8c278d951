"""Print the replay outcomes table of kvscope/engine_model/OUTCOMES.md (markdown) from ``--json`` runs.

Each row is one ``python -m kvscope replay --scenario NAME [--set k=v] --json`` in a fresh process.
Not part of ``make bench`` (name without the ``bench_`` prefix): it replays every scenario in full,
which takes several minutes (glm5-dsa paired: the longest).

Usage: ``python bench/outcomes_table.py [--jsonl OUT]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

RUNS: list[tuple[str, list[str]]] = [
    ("glm5-dsa", []),
    ("glm5-dsa", ["enable_block_reuse=false"]),
    ("glm5-dsa", ["draft_mode=paired", "engine_version=main"]),
    ("shared-prefix", []),
    ("shared-prefix", ["enable_block_reuse=false"]),
    ("shared-prefix", ["draft_mode=paired", "engine_version=main"]),
    ("qwen-hybrid-mtp", []),
    ("qwen-hybrid-mtp", ["draft_cursor_sizing=chunk"]),
    ("qwen-hybrid-mtp", ["enable_block_reuse=false"]),
    ("qwen-hybrid-mtp", ["draft_mode=paired"]),
    ("qwen-hybrid-mtp", ["draft_mode=paired", "draft_cursor_sizing=chunk"]),
    ("mooncake-conversation", []),
    ("near-miss", []),
    ("oversize", []),
]

HEADER = ("| scenario | `--set` | engine_fatal | fatal_message | fatal_request_id | requests total / completed "
          "/ failed / rejected | sim_seconds | peak_utilization target / draft | prefix_hit_rate | "
          "goodput_tokens_per_s | mean_running_requests | queue_wait p50 / p99 (s) | wall_seconds |")


def replay_json(scenario: str, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "kvscope", "replay", "--scenario", scenario, "--json"]
    for pair in overrides:
        cmd += ["--set", pair]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def row(scenario: str, overrides: list[str], d: dict) -> str:
    message = f"`{d['fatal_message']}`" if d["fatal_message"] else ""
    rid = "" if d["fatal_request_id"] is None else str(d["fatal_request_id"])
    pu = d["peak_utilization"]
    return (f"| {scenario} | {' '.join(overrides) or '(defaults)'} | {str(d['engine_fatal']).lower()} | {message} "
            f"| {rid} | {d['requests_total']} / {d['requests_completed']} / {d['requests_failed']} / "
            f"{d['requests_rejected']} | {d['sim_seconds']:.1f} | {pu.get('target', 0):.3f} / "
            f"{pu.get('draft', 0):.3f} | {d['prefix_hit_rate']:.3f} | {d['goodput_tokens_per_s']:.1f} | "
            f"{d['mean_running_requests']:.2f} | {d['queue_wait_p50_s']:.2f} / {d['queue_wait_p99_s']:.2f} | "
            f"{d['wall_seconds']:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jsonl", help="also write every summary as one JSON line here")
    args = parser.parse_args()
    sink = open(args.jsonl, "w") if args.jsonl else None  # noqa: SIM115 - closed below
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for scenario, overrides in RUNS:
            data = replay_json(scenario, overrides)
            if sink is not None:
                sink.write(json.dumps({"scenario": scenario, "set": overrides, **data}) + "\n")
            print(row(scenario, overrides, data), flush=True)
    finally:
        if sink is not None:
            sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
