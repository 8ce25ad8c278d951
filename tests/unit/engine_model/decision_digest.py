"""Decision digests of short replays: what ``test_decision_digest.py`` compares with its fixture.

A digest hashes every scheduling decision of a replay (per executed iteration: iteration number,
context requests with cursor and chunk size, generation ids, paused ids, recompute-paused ids) and,
separately, its summary (every key except ``wall_seconds``, ``config``, which grows when a knob is
added, ``engine_version``, which restates the config's build (each case names it or takes the
scenario's), and the keys added after the fixture was made while they hold their neutral value:
``NEW_SUMMARY_KEYS``). Speed work on the engine model must
leave both unchanged; a change to the model's decisions made on purpose regenerates the fixture:

    .venv/bin/python tests/unit/engine_model/decision_digest.py > tests/unit/engine_model/fixtures/decision_digests.json

(run from the repository root) and the commit says why the decisions changed. The decision hash
covers executed iterations only, so a fast-forward that skips more also changes it (and the summary's
``iterations_fast_forwarded``): then ``decision_rows`` shows that every executed iteration matches a
replay that runs every iteration (``test_fast_forward_changes_no_decision_...``) before the fixture
is regenerated.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvscope.replay import run

# (case name, scenario, overrides). DSA scenarios only (no mamba pool): short, and together they
# cover reuse on (fatal), reuse off, paired, preemption under pressure, rejections and open loop.
# The first cases pin the newest build read (main-00746ef) on the scenarios as they were before the
# engine_version knob and the GLM deployment's host tier (num_host_blocks=0): their digests are the
# ones the fixture held before, so those decisions did not move; they also keep the closed loop's
# earlier session starts (all at t=0, ``_BURST``). The rc25 cases pin the scenarios' defaults
# (build 1.3.0rc25, host tier on, sessions paced).
_MAIN = "engine_version=main-00746ef"
_NO_HOST = "num_host_blocks=0"
_BURST = "session_start_interval_s=0"
CASES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("glm5-dsa-64", "glm5-dsa", ("max_requests=64", _MAIN, _NO_HOST, _BURST)),
    ("glm5-dsa-64-reuse-off", "glm5-dsa", ("max_requests=64", "enable_block_reuse=false", _MAIN, _NO_HOST, _BURST)),
    ("glm5-dsa-64-paired", "glm5-dsa", ("max_requests=64", "draft_mode=paired", _MAIN, _NO_HOST, _BURST)),
    # Tight pools: suspension, recompute pause, preemption, eviction of reusable blocks, host tier.
    ("glm5-dsa-tight-reuse-off", "glm5-dsa", ("max_requests=150", "enable_block_reuse=false",
                                              "num_target_blocks=5000", "num_draft_blocks=5000",
                                              _MAIN, _NO_HOST, _BURST)),
    ("glm5-dsa-tight-paired", "glm5-dsa", ("max_requests=120", "draft_mode=paired",
                                           "num_target_blocks=5000", "num_draft_blocks=5000", _MAIN, _NO_HOST,
                                           _BURST)),
    ("glm5-dsa-tight-host-paired", "glm5-dsa", ("max_requests=120", "draft_mode=paired", "num_target_blocks=5000",
                                                "num_draft_blocks=5000", "num_host_blocks=20000", _MAIN,
                                                _BURST)),
    ("glm5-dsa-tight-host-reuse-off", "glm5-dsa", ("max_requests=150", "enable_block_reuse=false",
                                                   "num_target_blocks=5000", "num_draft_blocks=5000",
                                                   "num_host_blocks=20000", _MAIN, _BURST)),
    ("glm5-dsa-tight-target-reuse-on", "glm5-dsa", ("max_requests=120", "num_target_blocks=8000",
                                                    "num_draft_blocks=30000", _MAIN, _NO_HOST, _BURST)),
    ("shared-prefix", "shared-prefix", (_MAIN, _NO_HOST)),
    ("shared-prefix-reuse-off", "shared-prefix", ("enable_block_reuse=false", _MAIN, _NO_HOST)),
    ("shared-prefix-paired", "shared-prefix", ("draft_mode=paired", _MAIN, _NO_HOST)),
    ("mooncake-300", "mooncake-conversation", ("max_requests=300", _MAIN, _NO_HOST)),
    ("near-miss", "near-miss", (_MAIN, _NO_HOST)),
    ("oversize", "oversize", (_MAIN, _NO_HOST)),
    # The scenarios' own build (1.3.0rc25) and deployment (host tier).
    ("rc25-glm5-dsa-64", "glm5-dsa", ("max_requests=64",)),
    ("rc25-glm5-dsa-64-reuse-off", "glm5-dsa", ("max_requests=64", "enable_block_reuse=false")),
    ("rc25-glm5-dsa-tight-reuse-off", "glm5-dsa", ("max_requests=150", "enable_block_reuse=false",
                                                   "num_target_blocks=5000", "num_draft_blocks=5000")),
    ("rc25-shared-prefix", "shared-prefix", ()),
    ("rc25-shared-prefix-reuse-off", "shared-prefix", ("enable_block_reuse=false",)),
    ("rc25-mooncake-300", "mooncake-conversation", ("max_requests=300",)),
    ("rc25-near-miss", "near-miss", ()),
    # Without pipeline parallelism (one micro-batch in flight): the decisions the model made before
    # it ran pp_size micro-batches, identical hashes.
    ("pp1-glm5-dsa-64-reuse-off", "glm5-dsa", ("max_requests=64", "enable_block_reuse=false", _MAIN, _NO_HOST,
                                               "pp_size=1", _BURST)),
    ("pp1-rc25-glm5-dsa-64", "glm5-dsa", ("max_requests=64", "pp_size=1", _BURST)),
    ("pp1-rc25-shared-prefix", "shared-prefix", ("pp_size=1",)),
)


class _DecisionLog:
    """Instance-level observer of ``schedule_request`` (changes nothing in the engine)."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.count = 0

    def __call__(self, parts: Any) -> None:
        scheduler, executor = parts.scheduler, parts.executor
        schedule = scheduler.schedule_request

        def logged(active_requests, inflight_request_ids):
            out = schedule(active_requests, inflight_request_ids)
            row = (executor.iter_counter,
                   [(r.py_request_id, r.context_current_position, r.context_chunk_size)
                    for r in out.context_requests],
                   [r.py_request_id for r in out.generation_requests],
                   [r.py_request_id for r in out.paused_requests],
                   [r.py_request_id for r in out.recompute_paused_requests])
            self.hash.update(repr(row).encode())
            self.count += 1
            return out

        scheduler.schedule_request = logged


NEW_SUMMARY_KEYS = {"requests_cancelled": 0, "engine_stalled": False, "stall_message": None, "requests_unfinished": 0}
"""Summary keys newer than the fixture -> the value that means "nothing of that kind happened"."""


def digest(scenario: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    """``{"decisions": sha256, "num_schedule_calls": n, "summary": sha256, "sim_seconds": s}``."""
    log = _DecisionLog()
    summary = run(scenario, list(overrides), instrument=log).to_dict()
    summary.pop("wall_seconds")
    summary.pop("config")
    summary.pop("engine_version", None)
    for key, neutral in NEW_SUMMARY_KEYS.items():
        if summary.get(key) == neutral:
            summary.pop(key)
    text = json.dumps(summary, sort_keys=True)
    return {"decisions": log.hash.hexdigest(), "num_schedule_calls": log.count,
            "summary": hashlib.sha256(text.encode()).hexdigest(), "sim_seconds": summary["sim_seconds"],
            "requests_completed": summary["requests_completed"], "engine_fatal": summary["engine_fatal"]}


def main() -> None:
    print(json.dumps({name: digest(scenario, overrides) for name, scenario, overrides in CASES}, indent=1))


if __name__ == "__main__":
    main()


def decision_rows(scenario: str, overrides: tuple[str, ...], *, fast_forward: bool = True
                  ) -> tuple[dict[int, tuple], dict[str, Any]]:
    """Every executed iteration's decisions by iteration number, and the summary (without
    ``wall_seconds`` and ``config``). ``fast_forward=False`` runs every iteration in full."""
    rows: dict[int, tuple] = {}

    def observe(parts: Any) -> None:
        scheduler, executor = parts.scheduler, parts.executor
        if not fast_forward:
            executor.decode_fast_forward = None
        schedule = scheduler.schedule_request

        def logged(active_requests, inflight_request_ids):
            out = schedule(active_requests, inflight_request_ids)
            rows[executor.iter_counter] = (
                tuple((r.py_request_id, r.context_current_position, r.context_chunk_size)
                      for r in out.context_requests),
                tuple(r.py_request_id for r in out.generation_requests),
                tuple(r.py_request_id for r in out.paused_requests),
                tuple(r.py_request_id for r in out.recompute_paused_requests))
            return out

        scheduler.schedule_request = logged

    summary = run(scenario, list(overrides), instrument=observe).to_dict()
    summary.pop("wall_seconds")
    summary.pop("config")
    return rows, summary
