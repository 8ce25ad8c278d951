"""Pinned replay outcomes per engine version, through ``replay.run`` and the CLI.

Each built-in scenario runs the build its report ran by default (glm5-dsa family: 1.3.0rc25;
qwen-hybrid-mtp: 1.3.0rc27; ``versions.py``); the newest build read (main-00746ef) is one
``engine_version=main`` away.

- Block reuse ON, unpaired draft: fatal on every build, through the raise site the build reaches,
  with the build's message. glm5-dsa (sessions started 10 s apart) dies at a mirror's context
  resize, as the GLM report's engine did ("Draft KV cache context resize failed for request N:
  could not resize to X tokens", no ``[draft pool: ...]`` suffix on rc25); at batch 8 through a
  suspended mirror's resume ("Failed to resume draft KV cache for request N"). main-00746ef admits
  the mirror at scheduling and dies at the context resize, with the suffix.
- Block reuse OFF (equal-token pools): glm5-dsa and shared-prefix finish on every build at batch 64
  and batch 8 (the target reserves what each mirror later asks; its shortage is back-pressure), as
  the report says. A start-up burst of sessions 1.19 s apart can still end rc25 late (request 602,
  549 completed), through a route the real code has. Paired mode exists from 1.3.0rc27 and
  finishes; ``draft_mode=paired`` on 1.3.0rc25 is refused (no joint reuse in that build).
- qwen-hybrid-mtp (1.3.0rc27): the report's script warms the 12 prefixes one at a time, then sends
  the follow-ups; the engine dies at a new mirror's resume after the warm-ups (71 s; the report: 80-107 s).
  Reuse off does not save its smaller draft pool.

glm5-dsa's crash comes at about 285 simulated seconds (1-2 s of wall time), so it is replayed in
full; the reuse-off replays that finish take several seconds each.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from kvscope import replay

pytestmark = pytest.mark.slow

MAIN = "engine_version=main-00746ef"
DIAGNOSTIC = r" \[draft pool: \d+ live caches holding \d+ tokens, gpu_max_tokens=\d+\]"
CONTEXT_RESIZE = r"^Draft KV cache context resize failed for request (\d+): could not resize to (\d+) tokens"
RESIZE_FAILED_NEWEST = re.compile(CONTEXT_RESIZE + DIAGNOSTIC + "$")
RESIZE_FAILED_RELEASED = re.compile(CONTEXT_RESIZE + "$")
RESUME_FAILED = re.compile(r"^Failed to resume draft KV cache for request (\d+)$")
GENERATION_RESIZE_NEWEST = re.compile(
    r"^Draft KV cache generation resize failed for request (\d+): could not resize to (\d+) tokens"
    + DIAGNOSTIC + "$")

_cache: dict[tuple[str, tuple[str, ...]], replay.ReplaySummary] = {}


def run(source: str, *overrides: str) -> replay.ReplaySummary:
    key = (source, overrides)
    if key not in _cache:
        _cache[key] = replay.run(source, list(overrides))
    return _cache[key]


def assert_fatal(summary: replay.ReplaySummary, message: re.Pattern[str], *,
                 reuse: bool = True) -> re.Match[str]:
    assert summary.engine_fatal is True
    assert summary.healthy is False
    assert summary.fatal_error_type == "RuntimeError"
    match = message.match(summary.fatal_message or "")
    assert match, summary.fatal_message
    assert int(match.group(1)) == summary.fatal_request_id
    assert summary.requests_failed > 0
    assert summary.requests_completed + summary.requests_failed + summary.requests_rejected == summary.requests_total
    if reuse:  # the target holds shared prefixes once, each mirror a private copy
        assert summary.peak_utilization["draft"] > summary.peak_utilization["target"]
    else:  # equal-token pools without reuse run full together; the peak includes the failing
        # iteration, where the target already holds the first chunk of the request whose mirror the
        # draft then refused
        assert summary.peak_utilization["target"] >= summary.peak_utilization["draft"] > 0.95
    return match


def assert_finished(summary: replay.ReplaySummary, requests_total: int) -> None:
    assert summary.engine_fatal is False
    assert summary.fatal_message is None
    assert summary.requests_failed == 0
    assert summary.requests_total == requests_total
    assert summary.requests_completed + summary.requests_rejected == requests_total


# ---- glm5-dsa -------------------------------------------------------------------------------------
def test_glm5_dsa_dies_at_the_context_resize_when_reuse_on_and_unpaired_on_rc25():
    summary = run("glm5-dsa")
    assert summary.config["engine_version"] == "1.3.0rc25"
    assert summary.config["pp_size"] == 2
    assert summary.config["session_start_interval_s"] == 10.0
    match = assert_fatal(summary, RESIZE_FAILED_RELEASED)
    assert (summary.fatal_request_id, int(match.group(2))) == (192, 100753)
    assert summary.requests_completed == 147
    assert summary.fatal_ranks == list(range(8))  # every stage holds a draft manager (ranks.py)
    assert summary.killed_ranks == list(range(8))
    assert summary.prefix_hit_rate > 0.5


def test_glm5_dsa_dies_at_a_mirror_resume_at_batch_8_on_rc25():
    summary = run("glm5-dsa", "max_batch_size=8")
    assert_fatal(summary, RESUME_FAILED)
    assert (summary.fatal_request_id, summary.requests_completed) == (182, 139)


def test_glm5_dsa_dies_sooner_when_sessions_start_in_a_burst_on_rc25():
    ramp = run("glm5-dsa", "session_start_interval_s=-1")  # one request cycle over 24: 1.19 s
    burst = run("glm5-dsa", "session_start_interval_s=0")
    assert_fatal(ramp, RESUME_FAILED)
    assert (ramp.fatal_request_id, ramp.requests_completed) == (24, 2)
    assert_fatal(burst, RESIZE_FAILED_RELEASED)
    assert (burst.fatal_request_id, burst.requests_completed) == (19, 0)
    assert burst.sim_seconds < ramp.sim_seconds < run("glm5-dsa").sim_seconds


def test_glm5_dsa_dies_at_the_context_resize_when_reuse_on_and_unpaired_on_main():
    summary = run("glm5-dsa", MAIN)
    assert_fatal(summary, RESIZE_FAILED_NEWEST)
    assert summary.fatal_request_id == 192
    assert summary.fatal_ranks == list(range(8))


@pytest.mark.parametrize("mode", [("enable_block_reuse=false",), ("enable_block_reuse=false", "max_batch_size=8"),
                                  ("draft_mode=paired", MAIN), ("enable_block_reuse=false", MAIN)],
                         ids=["rc25-reuse-off", "rc25-reuse-off-batch-8", "main-paired", "main-reuse-off"])
def test_glm5_dsa_finishes_same_traffic_when_reuse_off_or_paired(mode):
    summary = run("glm5-dsa", *mode)
    assert_finished(summary, 3089)
    assert summary.rejection_reasons == {"prompt_len > max_seq_len": summary.requests_rejected}


def test_glm5_dsa_reuse_off_can_still_die_late_on_rc25_after_a_start_up_burst():
    # A suspended generation request's target resumes in phase 1; the pass's context mirrors then
    # take the draft over max_util_for_resume before its own mirror resumes (a route the real code has).
    summary = run("glm5-dsa", "enable_block_reuse=false", "session_start_interval_s=-1")
    assert_fatal(summary, RESUME_FAILED, reuse=False)
    assert (summary.fatal_request_id, summary.requests_completed) == (602, 549)
    assert summary.prefix_hit_rate == 0


def test_paired_is_refused_when_the_build_has_no_joint_reuse():
    with pytest.raises(ValueError, match=r"draft_mode=paired needs joint KV cache reuse \(#18093\), "
                                         r"which engine_version 1\.3\.0rc25 does not have"):
        replay.run("glm5-dsa", ["draft_mode=paired"])


# ---- shared-prefix --------------------------------------------------------------------------------
def test_shared_prefix_is_fatal_when_reuse_on_and_unpaired_on_rc25():
    summary = run("shared-prefix")
    match = assert_fatal(summary, RESIZE_FAILED_RELEASED)
    assert (summary.fatal_request_id, int(match.group(2))) == (10, 108415)
    assert summary.prefix_hit_rate > 0.5


def test_shared_prefix_is_fatal_with_the_pool_diagnostic_when_reuse_on_and_unpaired_on_main():
    summary = run("shared-prefix", MAIN)
    match = assert_fatal(summary, RESIZE_FAILED_NEWEST)
    assert (summary.fatal_request_id, int(match.group(2))) == (10, 108415)


@pytest.mark.parametrize("mode", [("enable_block_reuse=false",), ("enable_block_reuse=false", MAIN),
                                  ("draft_mode=paired", MAIN)],
                         ids=["rc25-reuse-off", "main-reuse-off", "main-paired"])
def test_shared_prefix_finishes_same_traffic_when_reuse_off_or_paired(mode):
    summary = run("shared-prefix", *mode)
    assert_finished(summary, 96)
    assert summary.requests_rejected == 0


def test_paired_pools_stay_equal_when_shared_prefix():
    summary = run("shared-prefix", "draft_mode=paired", MAIN)
    assert summary.peak_utilization["draft"] == summary.peak_utilization["target"]


# ---- qwen-hybrid-mtp ------------------------------------------------------------------------------
def test_qwen_hybrid_dies_at_the_mirror_resume_after_its_warm_ups_on_rc27():
    summary = run("qwen-hybrid-mtp")
    assert summary.config["engine_version"] == "1.3.0rc27"
    assert (summary.config["warmup_concurrency"], summary.config["client_max_tokens"]) == (1, "32768")
    assert_fatal(summary, RESUME_FAILED)
    assert summary.fatal_request_id == 22
    assert summary.requests_completed == 12  # the twelve warm-ups
    assert 60 < summary.sim_seconds < 90
    # The hybrid target's mamba state pool (71 slots) is reported beside the two KV pools.
    assert summary.pool_capacity_blocks == {"target": 35936, "draft": 22848, "mamba": 71}
    assert 0 < summary.peak_utilization["mamba"] <= 1


def test_qwen_hybrid_dies_during_the_warm_ups_when_every_client_warms_at_once():
    summary = run("qwen-hybrid-mtp", "warmup_concurrency=0")
    assert_fatal(summary, RESUME_FAILED)
    assert summary.requests_completed == 0
    assert summary.sim_seconds < run("qwen-hybrid-mtp").sim_seconds / 2


@pytest.mark.parametrize(("overrides", "message"), [
    (("draft_cursor_sizing=chunk",), RESUME_FAILED),
    (("draft_cursor_sizing=chunk", MAIN), RESIZE_FAILED_NEWEST),
    ((MAIN,), RESIZE_FAILED_NEWEST),
], ids=["rc27-chunk", "main-chunk", "main-prompt"])
def test_qwen_hybrid_is_fatal_with_either_cursor_sizing_when_reuse_on(overrides, message):
    assert_fatal(run("qwen-hybrid-mtp", *overrides), message)


def test_qwen_hybrid_fails_the_generation_resize_when_reuse_off_on_main():
    summary = run("qwen-hybrid-mtp", "enable_block_reuse=false", MAIN)
    assert_fatal(summary, GENERATION_RESIZE_NEWEST)


# ---- healthy baseline and determinism -------------------------------------------------------------
def test_mooncake_conversation_is_healthy_when_stretched_arrivals():
    summary = run("mooncake-conversation", "max_requests=600")
    assert_finished(summary, 600)
    assert summary.goodput_tokens_per_s > 0


def test_mooncake_conversation_dies_on_rc25_when_stretched_only_2x():
    # The control's margin: at 2x the pools run full and rc25 refuses a suspended mirror's resume.
    summary = run("mooncake-conversation", "arrival_time_scale=2", "max_requests=600")
    assert_fatal(summary, RESUME_FAILED)
    assert summary.fatal_request_id == 456


def test_replay_is_identical_when_seed_repeats():
    first = replay.run("shared-prefix", ["enable_block_reuse=false", "seed=3"]).to_dict()
    second = replay.run("shared-prefix", ["enable_block_reuse=false", "seed=3"]).to_dict()
    for summary in (first, second):
        summary.pop("wall_seconds")
    assert first == second


# ---- CLI ------------------------------------------------------------------------------------------
REQUIRED_KEYS = {
    "requests_total", "requests_completed", "requests_failed", "requests_rejected", "engine_fatal",
    "fatal_message", "fatal_request_id", "sim_seconds", "wall_seconds", "peak_utilization",
    "prefix_hit_rate", "goodput_tokens_per_s", "mean_running_requests", "queue_wait_p50_s",
    "queue_wait_p99_s",
}


def test_cli_prints_one_json_object_when_json():
    out = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "shared-prefix", "--json"],
                         capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert REQUIRED_KEYS <= set(data)
    assert data["engine_fatal"] is True
    assert set(data["peak_utilization"]) == {"target", "draft"}
    assert out.stderr == ""


def test_cli_fails_with_one_line_when_knob_unknown():
    out = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "shared-prefix",
                          "--set", "max_batchsize=3", "--json"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1
    assert "unknown knob 'max_batchsize'" in out.stderr
