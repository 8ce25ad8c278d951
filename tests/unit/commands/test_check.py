from __future__ import annotations

import json

from kvscope.cli import main


def test_check_says_tensorrt_llm_is_not_installed_and_checks_the_model_when_run(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("TensorRT-LLM: not installed here (no module named 'tensorrt_llm'); "
                                   "nothing to check against the real engine.")
    assert ("Engine model: checking its classes against the 'main-00746ef' seam table, because "
            "KVCacheManagerV2Model (found in kvscope.engine_model) has admit_mirror and "
            "has_cache_tier_below_gpu") in out
    assert "ok        KVCacheManagerV2._prepare_draft_resources(self, scheduled_batch)  @00746ef9" in out
    assert out.splitlines()[-1] == "all seams match"


def test_check_json_prints_one_object_when_asked(capsys):
    assert main(["check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["tensorrt_llm"] == {"installed": False, "version": None, "table": None, "reason": None,
                                      "results": []}
    assert report["engine_model"]["table"] == "main-00746ef"
    assert "has admit_mirror and has_cache_tier_below_gpu" in report["engine_model"]["reason"]
    results = report["engine_model"]["results"]
    # 25 rows in the table, less the budget split and its costs (a config knob in the model, not a class)
    assert len(results) == 23 and all(r["ok"] and len(r["commit"]) == 40 for r in results)
