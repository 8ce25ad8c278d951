"""Records the synthetic-trace analyzer fixtures of ``tests/integration/test_synthetic_trace_drift.py``.

The drift episodes those tests read were recorded on 1.3.0rc25 with the chunked admission order of
the stored 46,253-character scheduler copy (``chunk_unit_checked_after_prepare=True``), before the
model's rc25 record took main's order (kvscope/engine_model/SOURCES.md, "rc25's chunked admission
order"). They are analyzer inputs, frozen here so that the rules they test do not move with the
engine model; what the analyzer does on the corrected model is measured by the corpus
(bench/corpus.py, bench/RESULTS.md). Run from the checkout:

    .venv/bin/python tests/integration/data/record_synthetic.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kvscope.engine_model import versions

RUNS = {"crash": ("seed=0",), "near-miss": ("seed=1", "max_requests=2500"),
        "rc27-3000": ("seed=67", "max_requests=3000", "engine_version=1.3.0rc27"),
        # The certain-finish rule needs a cap that says a request ends: here each client's max_tokens
        # is its request's output (a client that knows it, e.g. a fixed-length task). With no cap the
        # 191k-token prompt that ends after 10 tokens is not certain to, and the analyzer pages on this
        # healthy run (the corpus counts that).
        "paced-1.8": ("seed=100", "arrival_time_scale=1.8", "client_max_tokens=actual")}


def main() -> None:
    versions.ENGINE_BUILDS[versions.RC25.version] = dataclasses.replace(
        versions.RC25, chunk_unit_checked_after_prepare=True)
    from kvscope.app.session import EventFileSession
    from kvscope.replay import run
    from kvscope.replay.scenarios import TRACES_DIR

    here = Path(__file__).parent
    import sys

    only = set(sys.argv[1:])
    for name, sets in RUNS.items():
        if only and name not in only:
            continue
        path = here / f"synthetic-{name}.parquet"
        session = EventFileSession(str(path), label="synthetic_trace.jsonl")
        summary = run(str(TRACES_DIR / "synthetic_trace.jsonl"), list(sets), instrument=session).to_dict()
        keep = {k: summary[k] for k in ("engine_fatal", "fatal_message", "peak_utilization", "iterations")}
        (here / f"synthetic-{name}.json").write_text(json.dumps({"sets": sets, **keep}, indent=1) + "\n")
        print(name, keep)


if __name__ == "__main__":
    main()
