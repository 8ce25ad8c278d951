"""An admission gap that opens close (its debt within what finishing requests free) and deepens
later is critical from when it deepened, not from its start: its evidence says when
(``critical_at_iteration``/``critical_at_s``, both analyzers alike), and the exported alarm level
and the leads read that (before, the whole episode read critical in hindsight)."""

from __future__ import annotations

from kvscope import replay
from kvscope.analysis import FindingKind, analyze_files
from kvscope.analysis.incidents import alarm_intervals
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.app.session import EventFileSession
from kvscope.recording import read_frame
from kvscope.recording.reader import frame_to_rows


def test_a_gap_that_deepens_later_is_critical_from_then_in_both_analyzers(tmp_path):
    path = tmp_path / "g2.parquet"
    # Sessions 1.19 s apart: the traffic seed 2 was picked on (on the 10 s default ramp its one gap is
    # critical from its start).
    replay.run("glm5-dsa", ["seed=2", "session_start_interval_s=-1"], instrument=EventFileSession(path, label="glm5-dsa"))
    batch = analyze_files(path)
    gaps = [f for f in batch.findings if f.kind == FindingKind.ADMISSION_GAP]
    later = [f for f in gaps if f.evidence["critical_at_iteration"] not in (None, f.iteration_start)]
    assert later, [(f.iteration_start, f.evidence["critical_at_iteration"]) for f in gaps]
    g = later[0]
    assert g.iteration_start < g.evidence["critical_at_iteration"] <= g.iteration_end
    assert g.t_start_s < g.evidence["critical_at_s"] <= g.t_end_s
    sa = StreamingAnalyzer(max_findings=100_000)
    sa.feed(frame_to_rows(read_frame(path)))
    sa.close()
    live = {(f.iteration_start, f.evidence["critical_at_iteration"], f.evidence["critical_at_s"])
            for f in sa.findings if f.kind == FindingKind.ADMISSION_GAP}
    assert live == {(f.iteration_start, f.evidence["critical_at_iteration"], f.evidence["critical_at_s"]) for f in gaps}
    levels = [lv for a, b, lv in alarm_intervals([g], "draft")]
    assert levels == [1, 2]  # a warning until it deepened
