"""run_label: the build a header names, and what tells compared runs apart."""

from __future__ import annotations

from kvscope.analysis import events_to_frame
from kvscope.analysis.run_label import (
    UNKNOWN_BUILD,
    build_text,
    engine_version_of,
    remediation_at_start,
    run_descriptions,
)
from kvscope.events import EventKind
from kvscope.recording import Recorder
from kvscope.testing import FakeClock


def _model(version: str, **knobs: object) -> dict:
    return {"engine": "engine_model", "engine_version": f"model-of-{version}", "scenario": "glm5-dsa",
            "knobs": {"engine_version": version, **knobs}}


def test_build_is_the_headers_engine_version_when_it_names_one():
    meta = {"engine": "tensorrt_llm", "engine_version": "1.3.0rc25"}
    assert engine_version_of(meta) == "1.3.0rc25"
    assert build_text(meta) == "engine 1.3.0rc25"


def test_build_is_unknown_when_the_header_names_none():
    for meta in ({}, {"scenario": "x"}, {"engine_version": ""}, {"engine_version": None}):
        assert engine_version_of(meta) is None
        assert build_text(meta) == UNKNOWN_BUILD == "unknown build"


def test_an_engine_model_recordings_knob_names_the_build_when_its_label_says_another():
    meta = {"engine": "engine_model", "engine_version": "model-of-main-00746ef", "knobs": {"engine_version": "1.3.0rc27"}}
    assert engine_version_of(meta) == "model-of-1.3.0rc27"
    # Another engine's knobs are not the model's: its header's label stands.
    assert engine_version_of({**meta, "engine": "tensorrt_llm"}) == "model-of-main-00746ef"


def test_descriptions_name_scenario_build_and_only_the_knobs_that_differ():
    metas = [_model("1.3.0rc25", seed=0, enable_block_reuse=True, max_sim_seconds=150.0),
             _model("main-00746ef", seed=0, enable_block_reuse=False, max_sim_seconds=150.0)]
    assert run_descriptions(metas) == [
        "glm5-dsa on engine model-of-1.3.0rc25, enable_block_reuse=true",
        "glm5-dsa on engine model-of-main-00746ef, enable_block_reuse=false",
    ]


def test_descriptions_name_a_knob_one_header_lacks_and_the_remediation_when_it_differs():
    metas = [_model("main-00746ef", cancel_rate=0.5), _model("main-00746ef"), {"scenario": "trace.jsonl"}]
    assert run_descriptions(metas, ["off", "on", "off"]) == [
        "glm5-dsa on engine model-of-main-00746ef, cancel_rate=0.5, remediation=off",
        "glm5-dsa on engine model-of-main-00746ef, remediation=on",
        "trace.jsonl on unknown build, remediation=off",
    ]
    # The same everywhere: nothing to tell apart beyond scenario and build.
    assert run_descriptions([_model("1.3.0rc25"), _model("1.3.0rc25")], ["on", "on"]) == [
        "glm5-dsa on engine model-of-1.3.0rc25"] * 2


def test_remediation_at_start_is_the_mode_recorded_at_iteration_zero():
    def recorded(*records: tuple[int, str]) -> object:
        rec = Recorder(clock=FakeClock())
        for iteration, reason in records:
            rec.iteration = iteration
            rec.record(EventKind.REMEDIATION_MODE_CHANGED, reason=reason)
        return events_to_frame(rec.drain())

    assert remediation_at_start(recorded((0, "mode=on policy=draft-reserve previous=off enforcing=1"))) == "on"
    # Switched on later (an operator, a trigger): the run started off.
    assert remediation_at_start(recorded((40, "mode=on policy=draft-reserve previous=off enforcing=1"))) == "off"
    assert remediation_at_start(recorded()) == "off"
