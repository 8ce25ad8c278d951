"""Pinned replay outcomes per engine version, through ``replay.run`` and the CLI.

Each built-in scenario runs the build its report ran by default (glm5-dsa family: 1.3.0rc25;
qwen-hybrid-mtp: 1.3.0rc27; ``versions.py``); the newest build read (main-00746ef) is one
``engine_version=main`` away.

- Block reuse ON, unpaired draft: fatal on every build, through the raise site the build reaches,
  with the build's message. glm5-dsa and shared-prefix run pp_size 2 (two micro-batches in flight).
  On 1.3.0rc25 the glm5-dsa burst ends at a new mirror's first resume: rc25's chunked admission
  prepares (creates and resumes the TARGET cache of) a first chunk it then does not schedule, so
  when that request is scheduled later its target cache is already active, and its mirror, born in
  ``_prepare_draft_resources``, meets the resume gate (``max_util_for_resume``) alone: "Failed to
  resume draft KV cache for request N". shared-prefix ends at a mirror's context resize ("Draft KV
  cache context resize failed for request N: could not resize to X tokens", no ``[draft pool: ...]``
  suffix on rc25). main-00746ef admits the mirror at scheduling and dies at the context resize,
  with the suffix.
- Block reuse OFF (equal-token pools): on 1.3.0rc25 glm5-dsa's first 64 requests finish at the
  deployment guide's batch 8 (the full replay dies later, request 129) but die at a mirror's resume
  at batch 64 (the same rc25 admission order), and so does shared-prefix; the GLM report saw no
  failure (SOURCES.md says what the model cannot explain, and that the start-up schedule does not). On main-00746ef both finish. Paired mode exists from 1.3.0rc27 and finishes;
  ``draft_mode=paired`` on 1.3.0rc25 is refused (no joint reuse in that build).
- qwen-hybrid-mtp (1.3.0rc27) is fatal with either cursor sizing; with reuse off on main its smaller
  draft pool fails the generation resize.

Shortened but faithful workloads, to keep this file to about a minute on 2 cores:
- glm5-dsa replays the first 64 requests of the Claude Code traces (``max_requests=64``, 24 in flight,
  shared tools+system prefix on, sessions started 1.19 s apart: the scenario's paced default): the
  crash comes while the first 24 sessions' long prompts fill the pools, and 64 requests cover it.
  The engine, the pools and the traffic are otherwise the scenario's; the full replays that end
  after request 64 are pinned in full (a few seconds each).
- shared-prefix and qwen-hybrid-mtp run in full; mooncake-conversation replays its first 400 requests.
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
GLM5_SHORT = ["max_requests=64"]

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
def test_glm5_dsa_dies_at_a_mirror_resume_when_reuse_on_and_unpaired_on_rc25():
    summary = run("glm5-dsa", *GLM5_SHORT)
    assert summary.config["engine_version"] == "1.3.0rc25"
    assert summary.config["pp_size"] == 2
    assert_fatal(summary, RESUME_FAILED)
    assert summary.fatal_request_id == 24
    assert summary.fatal_ranks == list(range(8))  # every stage holds a draft manager (ranks.py)
    assert summary.killed_ranks == list(range(8))
    assert summary.prefix_hit_rate > 0


def test_glm5_dsa_dies_at_the_mirror_resume_without_pipeline_parallelism_on_rc25():
    summary = run("glm5-dsa", *GLM5_SHORT, "pp_size=1")
    assert_fatal(summary, RESUME_FAILED)
    assert summary.fatal_request_id == 26


def test_glm5_dsa_dies_earlier_when_sessions_start_together_on_rc25():
    # The closed loop's earlier default, one --set away: 24 sessions released at t=0.
    summary = run("glm5-dsa", *GLM5_SHORT, "session_start_interval_s=0")
    assert_fatal(summary, RESUME_FAILED)
    assert summary.fatal_request_id == 23
    assert summary.requests_completed == 0
    assert summary.sim_seconds < run("glm5-dsa", *GLM5_SHORT).sim_seconds


def test_glm5_dsa_dies_at_the_context_resize_when_reuse_on_and_unpaired_on_main():
    summary = run("glm5-dsa", *GLM5_SHORT, MAIN)
    assert_fatal(summary, RESIZE_FAILED_NEWEST)
    assert summary.fatal_request_id == 23
    assert summary.fatal_ranks == list(range(8))


@pytest.mark.parametrize("mode", [("enable_block_reuse=false", "max_batch_size=8"),
                                  ("draft_mode=paired", MAIN), ("enable_block_reuse=false", MAIN)],
                         ids=["rc25-reuse-off-batch-8", "main-paired", "main-reuse-off"])
def test_glm5_dsa_finishes_same_traffic_when_reuse_off_or_paired(mode):
    summary = run("glm5-dsa", *GLM5_SHORT, *mode)
    assert_finished(summary, 64)
    assert summary.rejection_reasons == {"prompt_len > max_seq_len": summary.requests_rejected}


def test_glm5_dsa_dies_at_a_mirror_resume_when_reuse_off_at_batch_64_on_rc25():
    summary = run("glm5-dsa", *GLM5_SHORT, "enable_block_reuse=false")
    assert_fatal(summary, RESUME_FAILED, reuse=False)
    assert summary.fatal_request_id == 23
    assert summary.prefix_hit_rate == 0


def test_glm5_dsa_dies_later_at_a_mirror_resume_when_reuse_off_at_batch_8_on_rc25():
    # The first 64 requests finish at batch 8 (above); the whole replay does not.
    summary = run("glm5-dsa", "enable_block_reuse=false", "max_batch_size=8")
    assert_fatal(summary, RESUME_FAILED, reuse=False)
    assert summary.fatal_request_id == 129
    assert summary.requests_completed == 100


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


@pytest.mark.parametrize("mode", [("enable_block_reuse=false", MAIN), ("draft_mode=paired", MAIN)],
                         ids=["main-reuse-off", "main-paired"])
def test_shared_prefix_finishes_same_traffic_when_reuse_off_or_paired(mode):
    summary = run("shared-prefix", *mode)
    assert_finished(summary, 96)
    assert summary.requests_rejected == 0


def test_shared_prefix_dies_at_a_mirror_resume_when_reuse_off_on_rc25():
    summary = run("shared-prefix", "enable_block_reuse=false")
    assert_fatal(summary, RESUME_FAILED, reuse=False)
    assert summary.fatal_request_id == 12


def test_paired_pools_stay_equal_when_shared_prefix():
    summary = run("shared-prefix", "draft_mode=paired", MAIN)
    assert summary.peak_utilization["draft"] == summary.peak_utilization["target"]


# ---- qwen-hybrid-mtp ------------------------------------------------------------------------------
def test_qwen_hybrid_dies_at_the_mirror_resume_when_reuse_on_on_rc27():
    summary = run("qwen-hybrid-mtp")
    assert summary.config["engine_version"] == "1.3.0rc27"
    assert_fatal(summary, RESUME_FAILED)
    assert summary.fatal_request_id == 10
    # The hybrid target's mamba state pool (71 slots) is reported beside the two KV pools.
    assert summary.pool_capacity_blocks == {"target": 35936, "draft": 22848, "mamba": 71}
    assert 0 < summary.peak_utilization["mamba"] <= 1


@pytest.mark.parametrize(("overrides", "message"), [
    (("draft_cursor_sizing=chunk",), RESIZE_FAILED_RELEASED),
    (("draft_cursor_sizing=chunk", MAIN), RESIZE_FAILED_NEWEST),
    ((MAIN,), RESIZE_FAILED_NEWEST),
], ids=["rc27-chunk", "main-chunk", "main-prompt"])
def test_qwen_hybrid_is_fatal_at_the_context_resize_when_reuse_on(overrides, message):
    assert_fatal(run("qwen-hybrid-mtp", *overrides), message)


def test_qwen_hybrid_fails_the_generation_resize_when_reuse_off_on_main():
    summary = run("qwen-hybrid-mtp", "enable_block_reuse=false", MAIN)
    assert_fatal(summary, GENERATION_RESIZE_NEWEST)


# ---- healthy baseline and determinism -------------------------------------------------------------
def test_mooncake_conversation_is_healthy_when_stretched_arrivals():
    summary = run("mooncake-conversation", "max_requests=400")
    assert_finished(summary, 400)
    assert summary.goodput_tokens_per_s > 0


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
