"""kvscope check and the instrumentor against an importable stand-in of TensorRT-LLM.

TensorRT-LLM cannot be installed here. The stand-in package is generated from the signatures in the
source snapshot (``snapshots/main-00746ef.json`` and ``main-0004396.json``: facts read from the real
code), placed at the real module paths, with two deliberate drifts: ``resize_context`` gained a
parameter and ``admit_mirror`` is gone. The seam table is chosen by the manager's methods, so without
``admit_mirror`` the stand-in is taken for a build with joint reuse and no scheduler-side mirror
admission (1.3.0rc27), and the check says so. Everything runs in a child interpreter so the stand-in never
leaks into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SNAPSHOTS = Path(__file__).resolve().parents[2] / "kvscope" / "engines" / "trtllm" / "snapshots"
MANAGER = "tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py"
SCHEDULER = "tensorrt_llm/_torch/pyexecutor/scheduler/scheduler_v2.py"
RESOURCES = "tensorrt_llm/_torch/pyexecutor/resource_manager.py"
EXECUTOR = "tensorrt_llm/_torch/pyexecutor/py_executor.py"
UTIL = "tensorrt_llm/_torch/pyexecutor/_util.py"


def _methods() -> dict[str, dict[str, str]]:
    by_class: dict[str, dict[str, str]] = {}
    for name in ("main-0004396.json", "main-00746ef.json"):
        for cls, data in json.loads((SNAPSHOTS / name).read_text())["classes"].items():
            by_class.setdefault(cls, {}).update(data["methods"])
    return by_class


def _class_source(name: str, methods: dict[str, str]) -> str:
    lines = [f"class {name}:"]
    for method, sig in methods.items():
        if sig == "property":
            lines += ["    @property", f"    def {method}(self):", "        return False"]
        else:
            lines += [f"    def {method}{sig}:", "        return None"]
    return "\n".join(lines) + "\n"


JOINT_REUSE_AND_LATER = ("prepare_context_cache", "try_allocate_draft_context", "admit_mirror",
                         "has_cache_tier_below_gpu")


def _standin(root: Path, *, drift: bool = True, pre_joint_reuse: bool = False) -> None:
    """``pre_joint_reuse``: the manager without #18093's methods (nor later ones) but already under
    ``kv_cache/``, as upstream's stored 1fe0b08 and 63a36e8 have it; nothing at the old path."""
    methods = _methods()
    manager = dict(methods["KVCacheManagerV2"])
    if drift:
        manager["resize_context"] = "(self, req, num_tokens, history_length=None)"
        del manager["admit_mirror"]
    if pre_joint_reuse:
        manager = {name: sig for name, sig in manager.items() if name not in JOINT_REUSE_AND_LATER}
    files = {
        "tensorrt_llm/__init__.py": '__version__ = "1.4.0rc1"\n',
        "tensorrt_llm/_torch/__init__.py": "",
        "tensorrt_llm/_torch/pyexecutor/__init__.py": "",
        "tensorrt_llm/_torch/pyexecutor/kv_cache/__init__.py": "",
        "tensorrt_llm/_torch/pyexecutor/scheduler/__init__.py": "",
        MANAGER: _class_source("KVCacheManagerV2", manager),
        SCHEDULER: _class_source("KVCacheV2Scheduler", methods["KVCacheV2Scheduler"]),
        RESOURCES: _class_source("ResourceManager", methods["ResourceManager"]),
        EXECUTOR: _class_source("PyExecutor", methods["PyExecutor"]),
        UTIL: _class_source("KvCacheCreator", methods["KvCacheCreator"]),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _run(root: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=120)


def test_check_names_each_drift_in_plain_words_when_an_engine_is_installed(tmp_path):
    _standin(tmp_path)
    done = _run(tmp_path, "from kvscope.cli import main; raise SystemExit(main(['check', '--json']))")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    trt = report["tensorrt_llm"]
    assert (trt["installed"], trt["version"], trt["table"]) == (True, "1.4.0rc1", "1.3.0rc27")
    assert trt["reason"] == ("KVCacheManagerV2 (found in tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2)"
                             " has prepare_context_cache and try_allocate_draft_context")
    bad = {r["seam"]: r["detail"] for r in trt["results"] if not r["ok"]}
    assert bad == {
        "KVCacheManagerV2.resize_context": "parameters changed: recorded (self, req, num_tokens) at 00043967, "
                                           "found (self, req, num_tokens, history_length)",
    }
    assert report["engine_model"]["results"] and all(r["ok"] for r in report["engine_model"]["results"])


def test_check_takes_a_build_with_admit_mirror_for_the_newest_table(tmp_path):
    _standin(tmp_path, drift=False)
    done = _run(tmp_path, "from kvscope.cli import main; raise SystemExit(main(['check']))")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first == ("TensorRT-LLM 1.4.0rc1: checking the 'main-00746ef' seam table, because KVCacheManagerV2 "
                     "(found in tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2) has admit_mirror "
                     "and has_cache_tier_below_gpu")


def test_instrumentor_skips_drifted_seams_and_wraps_the_rest_when_an_engine_is_installed(tmp_path):
    _standin(tmp_path)
    done = _run(tmp_path, """
        import warnings
        from kvscope.engines.instrumentor import instrument, instrumentor_for, uninstrument
        from kvscope.recording import Recorder
        from tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2 import KVCacheManagerV2
        original = KVCacheManagerV2.prepare_context
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            instrument(recorder=Recorder(), engine=None)
        inst = instrumentor_for("tensorrt_llm")
        print(inst.version, len(inst.patched))
        print(sorted(str(w.message) for w in caught))
        print(KVCacheManagerV2.prepare_context is not original, KVCacheManagerV2.resize_context.__qualname__)
        uninstrument()
        print(KVCacheManagerV2.prepare_context is original)
    """)
    assert done.returncode == 0, done.stderr
    version_line, warnings_line, wrapped_line, restored_line = done.stdout.splitlines()
    assert version_line == "1.3.0rc27 19"  # 20 hooked seams in the table, the drifted one skipped
    assert "not wrapping KVCacheManagerV2.resize_context" in warnings_line
    assert "admit_mirror" not in warnings_line  # not in this build's table: never looked for
    assert wrapped_line == "True KVCacheManagerV2.resize_context"
    assert restored_line == "True"


def test_a_pre_joint_reuse_manager_at_the_new_path_is_checked_and_wrapped_where_it_is(tmp_path):
    # The rc25 table's rows name the old module path; such a build has the manager only at the new
    # one. Looking the class up by the rows' path found nothing: all ten manager seams unwrapped.
    _standin(tmp_path, drift=False, pre_joint_reuse=True)
    done = _run(tmp_path, "from kvscope.cli import main; raise SystemExit(main(['check', '--json']))")
    report = json.loads(done.stdout)
    trt = report["tensorrt_llm"]
    assert trt["table"] == "1.3.0rc25" and "found in tensorrt_llm._torch.pyexecutor.kv_cache." in trt["reason"]
    manager_rows = [r for r in trt["results"] if r["seam"].startswith("KVCacheManagerV2.")]
    assert len(manager_rows) == 10
    assert [r for r in trt["results"] if not r["ok"]] == [] and done.returncode == 0, done.stdout
    done = _run(tmp_path, """
        from kvscope.engines.instrumentor import instrument, instrumentor_for, uninstrument
        from kvscope.recording import Recorder
        from tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2 import KVCacheManagerV2
        original = KVCacheManagerV2.prepare_context
        instrument(recorder=Recorder(), engine=None)
        inst = instrumentor_for("tensorrt_llm")
        print(inst.version, KVCacheManagerV2.prepare_context is not original)
        uninstrument()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1.3.0rc25", "True"]
