"""Analyzer scoreboard over the full labelled corpus (bench/corpus.py FULL + every engine version):
recall, lead time before the crash, critical-ahead, false-critical rate, warnings per simulated
hour, per detector and overall, on all runs and on the held-out runs only.

    .venv/bin/python bench/bench_scoreboard.py [--json] [--out DIR] [--reuse]

Targets (issue 11): recall 100% with a critical finding >= 10 iterations before every draft-capacity
crash whose failing request has arrived by then; zero critical findings on healthy runs; at most a
handful of warnings per simulated hour on healthy runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
