"""Built-in scenarios carry the report's numbers; unknown names fail with the list of scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.engine_model.config import DraftCursorSizing, DraftMode
from kvscope.replay import scenarios
from kvscope.replay.scenarios import SCENARIOS, find_traces_dir, get_scenario
from kvscope.workloads.traces_claude import MEAN_REQUEST_CYCLE_S


def test_glm5_dsa_matches_report_when_built():
    config = get_scenario("glm5-dsa").config
    assert (config.pp_size, config.tp_size, config.max_draft_len) == (2, 4, 1)
    assert (config.max_num_tokens, config.max_batch_size, config.max_seq_len, config.tokens_per_block) == (
        8192, 64, 262144, 64)
    assert config.enable_block_reuse is True and config.enable_chunked_prefill is True
    assert config.max_gpu_total_bytes == int(60.51 * (1 << 30))
    assert (config.target_bytes_per_token, config.draft_bytes_per_token) == (49968, 1284)
    assert config.share_system_prefix is True
    assert config.draft_mode is DraftMode.UNPAIRED
    assert 16 <= config.requests_in_flight <= 32


def test_glm5_dsa_starts_a_session_every_10_s_when_default_and_one_mean_request_cycle_apart_when_derived():
    scenario = get_scenario("glm5-dsa")
    # kv-cache-tester's ramp adds 1-7 users per 30 s period; the default (three a period) lies inside it.
    assert scenario.config.session_start_interval_s == 10.0
    assert scenario.build_workload(scenario.config).session_start_interval_s == 10.0
    derived = scenario.config.with_overrides(["session_start_interval_s=-1"])
    assert MEAN_REQUEST_CYCLE_S == 28.67
    workload = scenario.build_workload(derived)
    assert workload.session_start_interval_s == pytest.approx(28.67 / 24)
    assert workload.describe()["session_start_interval_s"] == pytest.approx(1.1946, abs=1e-4)
    fewer = derived.with_overrides(["requests_in_flight=8"])
    assert scenario.build_workload(fewer).session_start_interval_s == pytest.approx(28.67 / 8)
    # The earlier burst (every session at t=0) is one --set away.
    burst = scenario.config.with_overrides(["session_start_interval_s=0"])
    assert scenario.build_workload(burst).session_start_interval_s == 0.0


def test_qwen_hybrid_matches_report_when_built():
    config = get_scenario("qwen-hybrid-mtp").config
    assert (config.tp_size, config.pp_size, config.max_draft_len, config.max_batch_size) == (2, 1, 3, 32)
    assert (config.max_seq_len, config.tokens_per_block) == (131072, 32)
    assert config.pool_blocks() == (35936, 22848)
    assert (config.num_mamba_slots, config.mamba_snapshot_interval) == (71, 2048)
    assert config.draft_cursor_sizing is DraftCursorSizing.PROMPT


def test_shared_prefix_runs_on_glm5_engine_when_built():
    shared, glm5 = get_scenario("shared-prefix").config, get_scenario("glm5-dsa").config
    assert shared.pool_blocks() == glm5.pool_blocks()
    assert shared.requests_in_flight >= 16


def test_every_scenario_builds_its_workload_when_asked():
    for name in ("shared-prefix", "qwen-hybrid-mtp", "near-miss", "oversize", "mooncake-conversation"):
        scenario = SCENARIOS[name]
        workload = scenario.build_workload(scenario.config)
        assert workload.tokens_per_block == scenario.config.tokens_per_block
        assert workload.next_arrival_s() is not None or workload.pop_arrivals(0.0)


def test_unknown_scenario_lists_names_when_misspelt():
    with pytest.raises(ValueError, match=r"unknown scenario 'glm5'; built-in scenarios: glm5-dsa, "):
        get_scenario("glm5")


def test_traces_are_found_beside_a_parent_of_a_clone_nested_below_the_shared_folder(tmp_path):
    (tmp_path / "shared" / "traces").mkdir(parents=True)
    clone = tmp_path / "s9" / "user"
    clone.mkdir(parents=True)
    assert find_traces_dir(clone, {}) == tmp_path / "shared" / "traces"
    assert find_traces_dir(clone, {"KVSCOPE_TRACES_DIR": "/elsewhere"}) == Path("/elsewhere")
    (tmp_path / "s9" / "shared" / "traces").mkdir(parents=True)
    assert find_traces_dir(clone, {}) == tmp_path / "s9" / "shared" / "traces"  # the nearest wins


def test_a_missing_bundled_trace_says_where_traces_are_looked_for_and_how_to_point_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setattr(scenarios, "TRACES_DIR", tmp_path)
    scenario = get_scenario("mooncake-conversation")
    with pytest.raises(FileNotFoundError) as caught:
        scenario.build_workload(scenario.config)
    message = str(caught.value)
    assert str(tmp_path / "conversation_trace.jsonl") in message and "KVSCOPE_TRACES_DIR" in message
