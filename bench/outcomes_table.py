"""Print the replay outcomes table of kvscope/engine_model/OUTCOMES.md (markdown) from ``--json`` runs.

Each row is one ``python -m kvscope replay --scenario NAME [--set k=v] --json`` in a fresh process.
Not part of ``make bench`` (name without the ``bench_`` prefix): it replays every scenario in full,
which takes several minutes (glm5-dsa paired: the longest).

Usage: ``python bench/outcomes_table.py [--jsonl OUT]``; ``--facts`` prints the reports' facts table
instead (``kvscope.replay.report_facts``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

# (scenario, --set pairs, the mechanism in one line). Each scenario runs its report's build by default
# (glm5 family: 1.3.0rc25; qwen-hybrid-mtp: 1.3.0rc27); main-00746ef is the newest build read.
MAIN = "engine_version=main"
RUNS: list[tuple[str, list[str], str]] = [
    ("glm5-dsa", [], "a mirror (no reuse) asks a private copy of a long shared-prefix prompt: context resize"),
    ("glm5-dsa", ["max_batch_size=8"], "batch 8: a suspended generation request's mirror is refused at its resume"),
    ("glm5-dsa", ["session_start_interval_s=-1"], "sessions 1.19 s apart (one request cycle over 24): the first "
                                                  "long prompts arrive together, a new mirror's resume is refused"),
    ("glm5-dsa", ["session_start_interval_s=0"], "every session at t=0 (a burst): same path, sooner"),
    ("glm5-dsa", ["enable_block_reuse=false"], "reuse off: the target reserves what each mirror later asks; its "
                                               "shortage is back-pressure, never a draft raise"),
    ("glm5-dsa", ["enable_block_reuse=false", "max_batch_size=8"], "reuse off at batch 8: the same"),
    ("glm5-dsa", ["enable_block_reuse=false", "session_start_interval_s=-1"],
     "reuse off with the 1.19 s ramp: a suspended generation mirror's resume after the pass's context mirrors "
     "took the draft over 0.95 (a route in the real code)"),
    ("glm5-dsa", [MAIN], "admit_mirror resumes at scheduling; the unsized mirror fails its context resize"),
    ("glm5-dsa", [MAIN, "draft_mode=paired"], "joint reuse: both pools sized and reverted together at admission"),
    ("glm5-dsa", [MAIN, "enable_block_reuse=false"], "admit_mirror defers a refused mirror; the target reserves what "
                                                  "the mirror asks, so its shortage is back-pressure"),
    ("shared-prefix", [], "mirror (no reuse) asks a full private copy of each shared prompt: context resize"),
    ("shared-prefix", ["enable_block_reuse=false"], "reuse off: back-pressure in the target"),
    ("shared-prefix", [MAIN], "same resize, with the [draft pool: ...] diagnostic"),
    ("shared-prefix", [MAIN, "enable_block_reuse=false"], "admit_mirror defers; the target reserves what the mirror asks"),
    ("shared-prefix", [MAIN, "draft_mode=paired"], "joint reuse: the draft shares prefixes too"),
    ("qwen-hybrid-mtp", [], "after the warm-ups, the follow-ups' prompt-sized mirrors fill the smaller draft pool; "
                            "a new mirror's first resume refused"),
    ("qwen-hybrid-mtp", ["warmup_concurrency=0"], "twelve concurrent 80k warm-ups overfill the draft pool alone"),
    ("qwen-hybrid-mtp", ["draft_cursor_sizing=chunk"], "cursor sizing: the follow-ups' cursor starts at the reused "
                                                       "80k prefix, so a mirror asks the same; the same resume"),
    ("qwen-hybrid-mtp", ["enable_block_reuse=false"], "draft pool smaller than target: reuse off does not save it"),
    ("qwen-hybrid-mtp", ["draft_mode=paired"], "model-only counterfactual: the hybrid class opts out of joint reuse"),
    ("qwen-hybrid-mtp", [MAIN], "admit_mirror; the prompt-sized mirror fails its context resize"),
    ("qwen-hybrid-mtp", [MAIN, "enable_block_reuse=false"], "draft pool smaller than target: generation resize"),
    ("mooncake-conversation", [], "healthy: arrivals stretched 2.5x, short prompts"),
    ("mooncake-conversation", ["arrival_time_scale=2"], "stretched only 2x: the pools run full; a suspended "
                                                        "generation mirror's resume is refused"),
    ("mooncake-conversation", ["arrival_time_scale=2", MAIN], "stretched 2x on main: admit_mirror defers "
                                                              "what the draft refuses"),
    ("near-miss", [], "draft peaks near capacity, no raise"),
    ("oversize", [], "prompts over max_seq_len rejected per request"),
]


HEADER = ("| scenario | engine_version | `--set` | engine_fatal | fatal_message | fatal_request_id | mechanism | "
          "requests total / completed / failed / rejected | sim_seconds | peak_utilization target / draft | "
          "prefix_hit_rate | goodput_tokens_per_s | mean_running_requests | queue_wait p50 / p99 (s) | "
          "wall_seconds |")


def replay_json(scenario: str, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "kvscope", "replay", "--scenario", scenario, "--json"]
    for pair in overrides:
        cmd += ["--set", pair]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def row(scenario: str, overrides: list[str], mechanism: str, d: dict) -> str:
    message = f"`{d['fatal_message']}`" if d["fatal_message"] else ""
    rid = "" if d["fatal_request_id"] is None else str(d["fatal_request_id"])
    pu = d["peak_utilization"]
    sets = " ".join(o for o in overrides if not o.startswith("engine_version=")) or "(defaults)"
    return (f"| {scenario} | {d['config']['engine_version']} | {sets} | {str(d['engine_fatal']).lower()} "
            f"| {message} | {rid} | {mechanism} | {d['requests_total']} / {d['requests_completed']} / {d['requests_failed']} / "
            f"{d['requests_rejected']} | {d['sim_seconds']:.1f} | {pu.get('target', 0):.3f} / "
            f"{pu.get('draft', 0):.3f} | {d['prefix_hit_rate']:.3f} | {d['goodput_tokens_per_s']:.1f} | "
            f"{d['mean_running_requests']:.2f} | {d['queue_wait_p50_s']:.2f} / {d['queue_wait_p99_s']:.2f} | "
            f"{d['wall_seconds']:.1f} |")


def replay_for_fact(scenario: str, overrides: list[str], remediation: str):  # noqa: ANN201 - ReplaySummary
    """The replay a report fact stands on, remediation attached when the fact names one."""
    from kvscope import replay
    from kvscope.app import remedy
    from kvscope.app.remediation_setting import parse_remediation_setting

    if remediation == "off":
        return replay.run(scenario, overrides)
    mode, policy = parse_remediation_setting(remediation)
    return replay.run(scenario, overrides, instrument=remedy.RemediatedSession(mode=mode, policy=policy,
                                                                                label=scenario))


def print_facts() -> int:
    from kvscope.replay import report_facts

    checks = [report_facts.check(fact, replay_for_fact) for fact in report_facts.REPORT_FACTS]
    print(report_facts.markdown_table(checks))
    held = sum(c.holds for c in checks)
    print(f"\n{held} of {len(checks)} facts within 2x")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", action="store_true", help="print the reports' facts table and stop")
    parser.add_argument("--jsonl", help="also write every summary as one JSON line here")
    parser.add_argument("--from-jsonl", help="render the table from a --jsonl file instead of replaying "
                                             "(rows it lacks are replayed)")
    args = parser.parse_args()
    if args.facts:
        return print_facts()
    recorded: dict[tuple[str, tuple[str, ...]], dict] = {}
    if args.from_jsonl:
        with open(args.from_jsonl) as f:
            for line in f:
                d = json.loads(line)
                recorded[(d.pop("scenario"), tuple(d.pop("set")))] = d
    sink = open(args.jsonl, "w") if args.jsonl else None  # noqa: SIM115 - closed below
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    try:
        for scenario, overrides, mechanism in RUNS:
            data = recorded.get((scenario, tuple(overrides))) or replay_json(scenario, overrides)
            if sink is not None:
                sink.write(json.dumps({"scenario": scenario, "set": overrides, **data}) + "\n")
            print(row(scenario, overrides, mechanism, data), flush=True)
    finally:
        if sink is not None:
            sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
