"""Frames: fixed dtypes and exact values on a hand-built stream."""

from __future__ import annotations

import numpy as np
from analysis_script import crash_script

from kvscope.analysis import iteration_view, pool_configs, pool_series, request_timeline


def test_request_timeline_has_reuse_vs_compute_per_pool_when_prefix_shared():
    script, _ = crash_script()
    tl = request_timeline(script.frame())
    r1, r2 = tl.loc[1], tl.loc[2]
    assert r1["prompt_tokens"] == 3200 and r1["num_chunks"] == 20 and r1["computed_tokens"] == 3200
    assert r1["reused_tokens_target"] == 0 and r1["outcome"] == "failed"
    assert r2["reused_tokens_target"] == 2400
    assert r2["reused_tokens_draft"] == 0
    assert r2["num_chunks"] == 25 and r2["computed_tokens"] == 25 * 32
    assert r2["outcome"] == "failed"
    assert r2["admitted_iteration"] == 20
    assert str(tl["outcome"].dtype) == "category"
    assert tl["prompt_tokens"].dtype == np.int64
    assert tl["admitted_s"].dtype == np.float64


def test_request_timeline_outcome_finished_when_request_completes():
    script, _ = crash_script(paired=True)
    tl = request_timeline(script.frame())
    assert tl.loc[2, "outcome"] == "finished"
    assert tl.loc[2, "output_tokens"] == 16
    assert tl.loc[2, "reused_tokens_draft"] == 2400  # paired mirror reuses


def test_pool_configs_parse_pool_configured_reason():
    script, _ = crash_script(paired=True)
    cfg = pool_configs(script.frame())
    assert list(cfg.index) == ["target", "draft"]
    assert cfg.loc["draft", "capacity_blocks"] == 400
    assert cfg.loc["draft", "tokens_per_block"] == 16
    assert bool(cfg.loc["draft", "paired"]) and bool(cfg.loc["draft", "in_admission"])
    assert cfg.loc["draft", "max_draft_len"] == 1


def test_pool_series_used_plus_available_is_capacity():
    script, _ = crash_script()
    ps = pool_series(script.frame())
    assert set(ps["pool"].astype(str)) == {"target", "draft"}
    assert ((ps["used_blocks"] + ps["available_blocks"]) == ps["capacity_blocks"]).all()
    draft = ps[ps["pool"] == "draft"]
    assert draft["used_blocks"].max() == 399
    assert ps["used_blocks"].dtype == np.int64


def test_iteration_view_counts_prefill_and_admissions_per_iteration():
    script, _ = crash_script()
    iv = iteration_view(script.frame())
    row0 = iv[iv["iteration"] == 0].iloc[0]
    assert row0["prefill_tokens"] == 160 and row0["num_admitted"] == 1
    row20 = iv[iv["iteration"] == 20].iloc[0]
    assert row20["num_admitted"] == 1 and row20["prefill_tokens"] == 32
    assert row20["utilization_draft"] == (201 + 152) / 400
