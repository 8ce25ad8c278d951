"""Every numeric knob has a range: a value outside it is refused with one line that states the range,
before anything is built; the largest values the allocating knobs accept still build an engine."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from kvscope.engine_model.build import build_engine
from kvscope.engine_model.config import EngineConfig, KnobRange
from kvscope.replay.scenarios import GLM5_DSA, SCENARIOS


def test_every_numeric_knob_has_a_range_and_every_scenario_default_lies_inside_it():
    hints = typing.get_type_hints(EngineConfig)
    for field in dataclasses.fields(EngineConfig):
        bounds = EngineConfig.knob_range(field.name)
        if hints[field.name] in (int, float):
            assert isinstance(bounds, KnobRange), field.name
        else:
            assert bounds is None, field.name  # flags, names and enums are checked by their type
        for name, scenario in SCENARIOS.items():
            value = getattr(scenario.config, field.name)
            assert bounds is None or bounds.contains(value), (name, field.name, value)


@pytest.mark.parametrize(("pair", "message"), [
    ("max_batch_size=1e30", r"^max_batch_size must be in \[1, 65536\], got 1e\+30$"),
    ("max_batch_size=65537", r"^max_batch_size must be in \[1, 65536\], got 65537$"),
    ("max_batch_size=0", r"^max_batch_size must be > 0, got 0 \(range: \[1, 65536\]\)$"),
    ("seed=-1", r"^seed must be >= 0, got -1 \(range: \[0, 18446744073709551615\]\)$"),
    ("session_start_interval_s=-2", r"^session_start_interval_s must be >= 0 or -1 \(derived\), got -2.0 "
                                    r"\(range: \[0, 86400\] or -1 \(derived\)\)$"),
    ("max_util_for_resume=0", r"^max_util_for_resume must be > 0, got 0.0 \(range: \(0, 1\]\)$"),
    ("pace=1e308", r"^pace must be in \[0, 1000\], got 1e\+308$"),
    ("max_gpu_total_bytes=2e12", r"^max_gpu_total_bytes must be in \[0, 1099511627776\], got 2000000000000$"),
])
def test_a_value_out_of_range_is_refused_with_the_range(pair, message):
    with pytest.raises(ValueError, match=message):
        GLM5_DSA.with_overrides([pair])


def test_each_end_of_a_range_is_accepted():
    config = GLM5_DSA.with_overrides(["think_time_cap_s=-1", "session_start_interval_s=86400", "seed=0",
                                      "max_util_for_resume=1", "num_extra_kv_tokens=-1"])
    assert (config.think_time_cap_s, config.session_start_interval_s) == (-1.0, 86400.0)
    with pytest.raises(ValueError, match=r"think_time_cap_s must be >= 0 or -1 \(no cap\), got -5.0"):
        GLM5_DSA.with_overrides(["think_time_cap_s=-5"])


def test_the_largest_slot_counts_accepted_still_build_an_engine():
    # The IndexMapper allocates one entry per slot: max_batch_size x pp_size + reserved.
    config = GLM5_DSA.with_overrides(["max_batch_size=65536", "pp_size=64", "num_reserved_index_slots=65536",
                                      "tp_size=1024", "max_draft_len=64"])
    parts = build_engine(config)
    assert parts.executor is not None
    assert config.index_mapper_capacity() == 65536 * 64 + 65536


def test_an_unknown_knob_names_the_nearest_ones_not_all():
    with pytest.raises(ValueError) as info:
        GLM5_DSA.with_overrides(["num_blocks=3"])
    message = str(info.value)
    assert message.startswith("unknown knob 'num_blocks'; valid knobs: ")
    assert "num_target_blocks" in message and "num_draft_blocks" in message
    assert "max_batch_size" not in message and "seed" not in message
    assert f"lists all {len(EngineConfig.knob_names())}" in message
    with pytest.raises(ValueError, match=r"^unknown knob 'zzz'; valid knobs: none with a similar name "):
        GLM5_DSA.with_overrides(["zzz=1"])
