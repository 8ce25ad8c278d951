"""The analyzer's vectorized need (debt ``final``, queued need) is :func:`kvscope.events.blocks_needed`
evaluated for many requests at once: both agree on recorded replays and on a grid of inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvscope.analysis.debt import compute_debt, request_prompts
from kvscope.analysis.frame import pool_configs
from kvscope.analysis.loader import read_columns
from kvscope.events import blocks_needed

DATA = Path(__file__).parent / "data"
REPLAYS = ["glm5-dsa", "qwen-hybrid-mtp", "shared-prefix", "oversize", "qwen-hybrid-mtp-mamba"]


@pytest.mark.parametrize("name", REPLAYS)
def test_debt_final_blocks_equal_blocks_needed_per_request_when_prompt_known(name):
    ev = read_columns(DATA / f"{name}.parquet")
    track = compute_debt(ev).track
    prompts = request_prompts(ev)
    configs = pool_configs(ev)
    known = track[track["request_id"].isin(prompts.index)]
    assert len(known) > 0
    for (rid, pool), final in known.groupby(["request_id", "pool"])["final_blocks"]:
        cfg = configs.loc[str(pool)]
        expected = blocks_needed(int(prompts[rid]), int(cfg["tokens_per_block"]),
                                 max_draft_len=int(cfg["max_draft_len"]),
                                 num_extra_kv_tokens=int(cfg["num_extra_kv_tokens"]))
        assert set(final.tolist()) == {expected}, (rid, pool)


def test_vectorized_need_with_reuse_equals_blocks_needed_on_a_grid():
    prompt = np.arange(0, 700, 7, dtype=np.float64)
    for tpb, draft, extra in [(64, 1, 0), (32, 3, 2), (16, 0, 0)]:
        total = prompt + draft + extra
        for reused in (0.0, 31.5, 64.0, 1000.0):
            # The expression of kvscope.analysis.queue.queued_need and debt.compute_debt.
            vectorized = np.ceil(np.maximum(total - reused, 0) / tpb)
            scalar = [blocks_needed(int(p), tpb, max_draft_len=draft, num_extra_kv_tokens=extra,
                                    reused_tokens=reused) for p in prompt]
            assert vectorized.astype(np.int64).tolist() == scalar
