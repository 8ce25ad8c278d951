"""``kvscope check [--json]``: compare the seam record with the engines that are importable here.

For an installed TensorRT-LLM it picks the seam table from the methods its ``KVCacheManagerV2`` has
(``admit_mirror``, ``has_cache_tier_below_gpu``, the joint-reuse methods; not from the module path),
says which table and why, and reports, seam by seam,
whether the class and method exist with the recorded parameters; where TensorRT-LLM is not
installed it says so plainly. It always checks the CPU engine model's classes against the seams the
model follows. Exit status 0 when everything checked matches, 1 on any mismatch.

``--json`` prints one object: ``{"ok", "tensorrt_llm": {"installed", "version", "table", "reason",
"results"}, "engine_model": {"table", "reason", "results"}}``; each result has ``seam``, ``module``,
``signature``, ``commit``, ``ok``, ``kind`` and ``detail``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvscope.engines.seams import SeamResult, seam_results
from kvscope.engines.trtllm.classes import (
    installed_seams_and_classes,
    installed_table_choice,
    installed_version,
)
from kvscope.engines.trtllm.seams import choose_table, seams_for


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("check", help="check the seam record against installed engines and the model")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _result_dict(r: SeamResult) -> dict[str, Any]:
    return {
        "seam": r.seam.qualname,
        "module": r.seam.module,
        "signature": r.seam.signature,
        "commit": r.seam.commit,
        "ok": r.ok,
        "kind": None if r.mismatch is None else r.mismatch.kind.value,
        "detail": None if r.mismatch is None else r.mismatch.detail,
    }


def collect() -> dict[str, Any]:
    """The check as data (what ``--json`` prints)."""
    from kvscope.engines.model.seams import model_classes, model_seams

    classes_of_model = model_classes()
    model_choice = choose_table(classes_of_model.get("KVCacheManagerV2"), module="kvscope.engine_model")
    model_results = seam_results(model_seams(seams_for(model_choice.table)), classes=classes_of_model)
    version = installed_version()
    trt: dict[str, Any] = {"installed": version is not None, "version": version, "table": None, "reason": None,
                           "results": []}
    trt_results: list[SeamResult] = []
    if version is not None:
        trt["reason"] = installed_table_choice().reason
        table, seams, classes = installed_seams_and_classes()
        trt_results = seam_results(seams, classes=classes)
        trt["table"] = table
        trt["results"] = [_result_dict(r) for r in trt_results]
    ok = all(r.ok for r in model_results) and all(r.ok for r in trt_results)
    return {
        "ok": ok,
        "tensorrt_llm": trt,
        "engine_model": {"table": model_choice.table, "reason": model_choice.reason,
                         "results": [_result_dict(r) for r in model_results]},
    }


def run(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report))
        return 0 if report["ok"] else 1
    trt = report["tensorrt_llm"]
    if not trt["installed"]:
        print("TensorRT-LLM: not installed here (no module named 'tensorrt_llm'); "
              "nothing to check against the real engine.")
    else:
        print(f"TensorRT-LLM {trt['version']}: checking the '{trt['table']}' seam table, because {trt['reason']}")
        for r in trt["results"]:
            print(_line(r))
    model = report["engine_model"]
    print(f"Engine model: checking its classes against the '{model['table']}' seam table, because "
          f"{model['reason']}")
    for r in model["results"]:
        print(_line(r))
    bad = sum(not r["ok"] for r in trt["results"]) + sum(not r["ok"] for r in model["results"])
    print("all seams match" if bad == 0 else f"{bad} mismatch(es)")
    return 0 if report["ok"] else 1


def _line(r: dict[str, Any]) -> str:
    if r["ok"]:
        return f"  ok        {r['seam']}{'' if r['signature'] == 'property' else r['signature']}  @{r['commit'][:8]}"
    return f"  MISMATCH  {r['seam']}: {r['detail']}"
