"""EngineConfig: knob names, the real budget split, --set parsing and validation messages."""

from __future__ import annotations

import dataclasses

import pytest

from kvscope.engine_model.config import (
    DraftCursorSizing,
    DraftMode,
    EngineConfig,
    split_kv_cache_budget_for_draft,
)
from kvscope.replay.scenarios import GLM5_DSA, QWEN_HYBRID_MTP

GIB = 1 << 30


def test_real_engine_knob_names_exist_when_listing_knobs():
    names = EngineConfig.knob_names()
    for real in ("max_batch_size", "max_num_tokens", "max_seq_len", "tokens_per_block",
                 "enable_block_reuse", "max_draft_len", "max_util_for_resume"):
        assert real in names
    real_flags = {name: is_real for name, _, is_real in EngineConfig.describe_knobs()}
    assert real_flags["max_util_for_resume"] is True
    assert real_flags["num_draft_blocks"] is False


def test_budget_split_gives_equal_tokens_when_glm5_dsa_costs():
    split = split_kv_cache_budget_for_draft(int(60.51 * GIB), target_slope=49968, target_intercept=0,
                                            draft_slope=1284, draft_intercept=0)
    assert split.target_bytes + split.draft_bytes == int(60.51 * GIB)
    assert split.draft_bytes == int(int(60.51 * GIB) * 1284 / (49968 + 1284))
    assert split.target_bytes // 49968 == 1_267_699
    assert split.draft_bytes // 1284 == 1_267_699
    assert GLM5_DSA.pool_blocks() == (19807, 19807)


def test_budget_split_charges_intercepts_when_fixed_costs():
    split = split_kv_cache_budget_for_draft(10_000, target_slope=3, target_intercept=1000,
                                            draft_slope=1, draft_intercept=500)
    # slope budget 8500 split 3:1 -> draft 500 + 2125
    assert split == type(split)(target_bytes=10_000 - 2625, draft_bytes=2625)


def test_budget_split_raises_when_fixed_costs_exceed_budget():
    with pytest.raises(ValueError, match="must exceed the combined fixed cost"):
        split_kv_cache_budget_for_draft(1000, target_slope=1, target_intercept=600, draft_slope=1,
                                        draft_intercept=400)


def test_given_block_counts_win_when_set():
    assert QWEN_HYBRID_MTP.pool_blocks() == (35936, 22848)
    assert QWEN_HYBRID_MTP.index_mapper_capacity() == 33
    assert GLM5_DSA.index_mapper_capacity() == 64 * 2 + 1


def test_set_pairs_coerce_types_when_overriding():
    config = GLM5_DSA.with_overrides(["enable_block_reuse=off", "draft_mode=paired", "engine_version=main",
                                      "max_batch_size=16",
                                      "pace=1.5", "max_gpu_total_bytes=6.4e10", "draft_cursor_sizing=prompt"])
    assert config.enable_block_reuse is False
    assert config.draft_mode is DraftMode.PAIRED
    assert config.max_batch_size == 16
    assert config.pace == 1.5
    assert config.max_gpu_total_bytes == 64_000_000_000
    assert config.draft_cursor_sizing is DraftCursorSizing.PROMPT


def test_set_rejects_unknown_key_when_misspelt():
    with pytest.raises(ValueError, match=r"unknown knob 'max_batchsize'; valid knobs: .*max_batch_size"):
        GLM5_DSA.with_overrides(["max_batchsize=3"])


def test_set_rejects_value_when_not_the_knob_type():
    with pytest.raises(ValueError, match=r"^knob 'max_batch_size' expects int \(an integer\), got 'many'$"):
        GLM5_DSA.with_overrides(["max_batch_size=many"])
    with pytest.raises(ValueError, match=r"^knob 'seed' expects int \(an integer\), got 'abc'$"):  # no parser detail
        GLM5_DSA.with_overrides(["seed=abc"])
    with pytest.raises(ValueError, match=r"knob 'draft_mode' must be one of: unpaired, paired"):
        GLM5_DSA.with_overrides(["draft_mode=joint"])
    with pytest.raises(ValueError, match="--set expects key=value"):
        GLM5_DSA.with_overrides(["seed"])


def test_an_enum_knob_takes_its_value_in_any_case():
    from kvscope.engine_model.config import DraftMode

    config = GLM5_DSA.with_overrides(["engine_version=main-00746ef", "draft_mode=PAIRED"])
    assert config.draft_mode is DraftMode.PAIRED


def test_validation_states_rule_when_value_out_of_range():
    with pytest.raises(ValueError, match=r"max_util_for_resume must be in \(0, 1\], got 1.5"):
        dataclasses.replace(GLM5_DSA, max_util_for_resume=1.5)
    with pytest.raises(ValueError, match="max_batch_size must be > 0, got 0"):
        dataclasses.replace(GLM5_DSA, max_batch_size=0)
    with pytest.raises(ValueError, match="draft_mode=paired needs a draft pool"):
        dataclasses.replace(GLM5_DSA, max_draft_len=0, draft_mode="paired")


def test_session_start_interval_takes_minus_one_as_derived_and_nothing_else_below_zero():
    assert EngineConfig().session_start_interval_s == -1.0
    assert EngineConfig().with_overrides(["session_start_interval_s=0"]).session_start_interval_s == 0.0
    with pytest.raises(ValueError, match=r"session_start_interval_s must be >= 0 or -1 \(derived\), got -2.0"):
        EngineConfig(session_start_interval_s=-2.0)


def test_no_draft_pool_when_max_draft_len_zero():
    config = dataclasses.replace(GLM5_DSA, max_draft_len=0)
    target_blocks, draft_blocks = config.pool_blocks()
    assert draft_blocks == 0
    assert target_blocks == int(60.51 * GIB) // 49968 // 64


def test_engine_version_defaults_to_the_build_each_report_ran():
    assert GLM5_DSA.engine_version == "1.3.0rc25"
    assert QWEN_HYBRID_MTP.engine_version == "1.3.0rc27"
    assert EngineConfig().engine_version == "main-00746ef"


def test_engine_version_alias_resolves_to_the_newest_build_when_main():
    config = GLM5_DSA.with_overrides(["engine_version=main"])
    assert config.engine_version == "main-00746ef"
    assert config.engine_build.scheduler_admits_mirror is True
    assert GLM5_DSA.engine_build.scheduler_admits_mirror is False


def test_engine_version_rejects_an_unknown_build():
    with pytest.raises(ValueError, match=r"unknown engine_version '1\.2\.0'; known: 1\.3\.0rc25, 1\.3\.0rc27"):
        GLM5_DSA.with_overrides(["engine_version=1.2.0"])


def test_paired_is_refused_on_a_build_without_joint_reuse():
    with pytest.raises(ValueError, match=r"needs joint KV cache reuse \(#18093\), which engine_version "
                                         r"1\.3\.0rc25 does not have; set engine_version to 1\.3\.0rc27 or "
                                         r"main-00746ef"):
        GLM5_DSA.with_overrides(["draft_mode=paired"])
    assert GLM5_DSA.with_overrides(["draft_mode=paired", "engine_version=1.3.0rc27"]).draft_mode is DraftMode.PAIRED


def test_extra_kv_tokens_follow_get_num_extra_kv_tokens_when_mtp_has_three_draft_layers():
    # One-engine MTP keeps max_draft_len - 1 extra KV tokens per request (speculative/utils.py).
    assert QWEN_HYBRID_MTP.max_draft_len == 3
    assert QWEN_HYBRID_MTP.extra_kv_tokens == 2
    assert GLM5_DSA.extra_kv_tokens == 0  # MTP with one draft layer
    assert dataclasses.replace(GLM5_DSA, max_draft_len=0).extra_kv_tokens == 0
    assert QWEN_HYBRID_MTP.with_overrides(["num_extra_kv_tokens=5"]).extra_kv_tokens == 5
