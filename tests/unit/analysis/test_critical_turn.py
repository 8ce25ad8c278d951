"""A time-to-exhaustion finding that opened as a warning and turned critical later says where and
why it turned (its opening sentence describes a warning-level state), in both analyzers."""

from __future__ import annotations

import re
from pathlib import Path

from kvscope.analysis import analyze_files
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.recording import read_file
from kvscope.recording.reader import frame_to_rows

DATA = Path(__file__).parent / "data"
TURN = re.compile(r" Critical from iteration (\d+) at (\d+)% used \(")


def _tte(findings):
    return [f for f in findings if f.kind.value == "time_to_exhaustion"]


def test_a_finding_that_turned_critical_says_at_which_iteration_and_by_which_rule():
    findings = _tte(analyze_files(DATA / "glm5-dsa.parquet").findings)
    turned = [f for f in findings if f.evidence["critical_at_iteration"] not in (None, f.iteration_start)]
    assert turned, "the glm5-dsa replay has an episode that opens as a warning and turns critical"
    f = turned[0]
    m = TURN.search(f.summary)
    assert m and int(m.group(1)) == f.evidence["critical_at_iteration"]
    # the opening is a queue projection (a warning); the turn names the debt admitted requests owe
    assert "with the queue admitted" in f.summary[: m.start()]
    assert "certain: admitted requests owe" in f.summary[m.start():].split(" Open ")[0]


def test_a_finding_critical_from_its_start_or_never_critical_has_no_turn():
    for name in ("glm5-dsa-reuse-off", "glm5-dsa-rc27-reuse-off", "shared-prefix", "qwen-hybrid-mtp"):
        for f in _tte(analyze_files(DATA / f"{name}.parquet").findings):
            crit = f.evidence["critical_at_iteration"]
            assert bool(TURN.search(f.summary)) == (crit is not None and crit != f.iteration_start), (name, f.summary)


def test_the_streaming_analyzer_words_the_turn_as_the_batch_analyzer_does():
    path = DATA / "glm5-dsa.parquet"
    sa = StreamingAnalyzer()
    rows = frame_to_rows(read_file(path))
    for i in range(0, len(rows), 97):
        sa.feed(rows[i : i + 97])
    sa.close()
    live = [f.summary for f in _tte(sa.findings) if TURN.search(f.summary)]
    batch = [f.summary for f in _tte(analyze_files(path).findings) if TURN.search(f.summary)]
    assert live and live == batch
