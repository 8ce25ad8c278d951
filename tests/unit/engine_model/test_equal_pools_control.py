"""Scenario-level control for "what keeps equal-token pools in step with reuse off" (SOURCES.md).

``shared-prefix`` splits one budget so both pools hold the same tokens. With block reuse off the real
engine survives because the target reserves, at admission, the same draft slots the mirror will take
(``target_reserves_draft_slots``, default True). The control removes that reservation and the draft
pool raises the real fatal message again. Acceptance is pinned at 0.5 so rejected draft slots are
common (the control needs the mirror's transient draft slot to exceed what the target holds).
"""

from __future__ import annotations

from kvscope import replay

# The research question was answered on the newest build read, whose chunked admission checks the
# budget before preparing; on 1.3.0rc25 a first chunk can be prepared and kept without being
# scheduled, and shared-prefix with reuse off dies at a mirror's resume (OUTCOMES.md).
OVERRIDES = ["enable_block_reuse=false", "mtp_acceptance_rate=0.5", "engine_version=main-00746ef"]


def test_shared_prefix_with_reuse_off_finishes_when_target_reserves_draft_slots():
    summary = replay.run("shared-prefix", OVERRIDES)
    assert (summary.engine_fatal, summary.requests_completed) == (False, summary.requests_total)


def test_shared_prefix_with_reuse_off_crashes_when_target_reservation_is_removed():
    def capacity_only_target(parts):
        parts.kv_cache_manager.target_reserves_draft_slots = False

    summary = replay.run("shared-prefix", OVERRIDES, instrument=capacity_only_target)
    assert summary.engine_fatal is True
    assert summary.fatal_message.startswith("Draft KV cache generation resize failed for request ")
