"""The seam record, the engine model and the binding, each checked against facts read from the real
TensorRT-LLM source (``kvscope/engines/trtllm/snapshots/*.json``), never against each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.engine_model.request import LlmRequestModel
from kvscope.engines.binding import CACHE_ATTRIBUTES_READ, REQUEST_ATTRIBUTES_READ
from kvscope.engines.hooks import HOOKS, MODEL_ONLY
from kvscope.engines.manager_config import LOCATIONS
from kvscope.engines.model.seams import NOT_MODELLED, model_classes, model_seams
from kvscope.engines.seams import PROPERTY, check_seams, parse_parameters
from kvscope.engines.trtllm.seams import MODEL_VERSION, SEAMS_BY_VERSION, seams_for

SNAPSHOTS = Path(__file__).resolve().parents[2] / "kvscope" / "engines" / "trtllm" / "snapshots"


def _snapshots() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(SNAPSHOTS.glob("*.json"))}


def _facts_by_commit() -> dict[tuple[str, str], tuple[str, str]]:
    """('Class.method', commit) -> (module at that commit, signature), over every snapshot."""
    out = {}
    for snap in _snapshots().values():
        for cls_name, cls in snap["classes"].items():
            for method, sig in cls["methods"].items():
                out[(f"{cls_name}.{method}", cls["commit"])] = (cls["module"], sig)
    return out


def test_record_pins_the_report_build_and_the_newest_main_when_loaded():
    assert set(SEAMS_BY_VERSION) == {"1.3.0rc25", "1.3.0rc27", "main-0004396", "main-00746ef"}
    assert set(_snapshots()) == {"1.3.0rc25", "1.3.0rc27", "main-0004396", "main-00746ef"}


@pytest.mark.parametrize("version", sorted(SEAMS_BY_VERSION))
def test_every_seam_names_the_commit_its_signature_was_read_at_when_checked_against_snapshots(version):
    facts = _facts_by_commit()
    for seam in SEAMS_BY_VERSION[version]:
        key = (seam.qualname, seam.commit)
        assert key in facts, f"{version}: {seam.qualname} @ {seam.commit[:8]} is not in any source snapshot"
        module, signature = facts[key]
        if module != seam.module:
            # Read at another build's path: the record must say so in plain words.
            assert "not read at" in seam.note or "not stored at" in seam.note, seam
        if seam.signature == PROPERTY:
            assert signature == PROPERTY
        else:
            assert parse_parameters(seam.signature) == parse_parameters(signature), seam.qualname


def test_rc25_and_main_differ_where_the_source_differs_when_compared():
    rc25 = {s.qualname: s for s in seams_for("1.3.0rc25")}
    main = {s.qualname: s for s in seams_for("main-00746ef")}
    assert rc25["KVCacheManagerV2.resize_context"].module == "tensorrt_llm._torch.pyexecutor.kv_cache_manager_v2"
    assert main["KVCacheManagerV2.resize_context"].module == "tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2"
    only_main = set(main) - set(rc25)
    assert only_main == {"KVCacheManagerV2.prepare_context_cache", "KVCacheManagerV2.try_allocate_draft_context",
                         "KVCacheManagerV2.admit_mirror", "KVCacheManagerV2.has_cache_tier_below_gpu",
                         # The stored rc25-era scheduler has none of these three (its context and generation
                         # paths call the manager directly).
                         "KVCacheV2Scheduler._prepare_context_pair", "KVCacheV2Scheduler._try_allocate_context",
                         "KVCacheV2Scheduler._try_allocate_generation",
                         # No rc25-era _util.py is stored: the budget split is not recorded there.
                         "KvCacheCreator._split_kv_cache_budget_for_draft",
                         "KvCacheCreator._get_target_and_draft_cache_costs"}
    snaps = _snapshots()
    assert snaps["1.3.0rc25"]["facts"]["draft_len_charged_on_every_context_chunk"] is True
    assert snaps["main-0004396"]["facts"]["draft_len_charged_on_every_context_chunk"] is False
    absent_rc25 = set(snaps["1.3.0rc25"]["classes"]["KVCacheManagerV2"]["absent"])
    assert {"prepare_context_cache", "try_allocate_draft_context", "admit_mirror"} <= absent_rc25


def test_engine_model_classes_match_the_record_when_checked():
    mismatches = check_seams(model_seams(seams_for(MODEL_VERSION)), classes=model_classes())
    assert [str(m) for m in mismatches] == []
    # Left out only where the model has a config knob instead of a class, and still hooked for the real engine.
    assert NOT_MODELLED == ("KvCacheCreator._split_kv_cache_budget_for_draft",
                            "KvCacheCreator._get_target_and_draft_cache_costs")
    assert set(NOT_MODELLED) <= {s.qualname for s in seams_for(MODEL_VERSION)}
    # Hooked for the real engine, except the costs, which the sizing plan calls and never wraps.
    assert set(NOT_MODELLED) - set(HOOKS) == {"KvCacheCreator._get_target_and_draft_cache_costs"}


def test_every_wrapped_seam_has_a_hook_and_only_read_only_seams_lack_one():
    seams = {s.qualname for s in seams_for(MODEL_VERSION)}
    unhooked = seams - set(HOOKS)
    assert unhooked == {"KVCacheManagerV2.has_cache_tier_below_gpu", "KVCacheManagerV2.update_resources",
                        "KVCacheV2Scheduler._try_allocate_generation",
                        "KvCacheCreator._get_target_and_draft_cache_costs"}
    # Every hook wraps a recorded seam, except the engine model's own entry points.
    assert set(HOOKS) - seams == set(MODEL_ONLY)
    assert MODEL_ONLY == ("PyExecutorModel._fetch_and_activate_new_requests", "PyExecutorModel.add_request")


def test_dsa_manager_overrides_no_seam_so_class_level_wrapping_reaches_it():
    dsa = _snapshots()["1.3.0rc25"]["classes"]["DSACacheManagerV2"]
    assert dsa["bases"] == ["KVCacheManagerV2"]
    hooked = {q.split(".")[1] for q in HOOKS if q.startswith("KVCacheManagerV2.")}
    assert hooked.isdisjoint(dsa["overrides"])


def test_binding_reads_only_request_attributes_the_real_code_has():
    snaps = _snapshots()
    real = set()
    for snap in snaps.values():
        real |= set(snap["request_attributes"]["names"])
        real |= set(snap.get("request_constructor_keywords", {}).get("names", ()))
    assert set(REQUEST_ATTRIBUTES_READ) <= real


def test_binding_reads_only_cache_attributes_the_real_code_uses():
    real = set(_snapshots()["main-0004396"]["cache_attributes"]["names"])
    assert set(CACHE_ATTRIBUTES_READ) <= real


def test_the_config_reader_looks_only_where_the_real_adapter_keeps_each_value():
    adapter = _snapshots()["main-0004396"]["classes"]["KVCacheManagerV2"]
    roots = {path.split(".")[0] for paths in LOCATIONS.values() for path in paths}
    assert roots <= set(adapter["attributes"])
    assert "max_util_for_resume" not in adapter["attributes"]  # the adapter keeps no copy of its own
    for name in ("max_util_for_resume", "pp_size", "max_seq_len"):
        assert list(LOCATIONS[name]) == adapter["config_values"][name]


def test_engine_model_request_has_every_attribute_the_binding_reads():
    req = LlmRequestModel(1, 10, 2, (1, 2))
    missing = [a for a in REQUEST_ATTRIBUTES_READ if a != "max_beam_num_tokens" and not hasattr(req, a)]
    assert missing == []
    assert hasattr(req, "num_generated_tokens")  # preferred over max_beam_num_tokens in the model


def test_rc25_table_records_only_scheduler_methods_the_stored_rc25_scheduler_has():
    stored = _snapshots()["1.3.0rc25"]["stored_scheduler"]
    rows = [s for s in seams_for("1.3.0rc25") if s.class_name == "KVCacheV2Scheduler"]
    assert [s.method_name for s in rows] == ["schedule_request"]
    for seam in rows:
        assert seam.module == stored["module"]
        assert parse_parameters(seam.signature) == parse_parameters(stored["methods"][seam.method_name])
    # Every scheduler method another table records and this copy lacks is listed as absent.
    elsewhere = {s.method_name for t in SEAMS_BY_VERSION.values() for s in t if s.class_name == "KVCacheV2Scheduler"}
    assert elsewhere - set(stored["methods"]) == {"_try_allocate_context", "_try_allocate_generation",
                                                  "_prepare_context_pair"}
    assert elsewhere - set(stored["methods"]) <= set(stored["absent"])
