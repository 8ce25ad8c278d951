"""Finding labels stay legible where findings open together and next to the engine failure: the live
panels' marks (kvscope.ui.marks) and the report's (kvscope.ui.figures.finding_marks)."""

from __future__ import annotations

import pandas as pd
import pytest

from kvscope.ui.figures import LABEL_STEP_PX, finding_marks, spread_labels
from kvscope.ui.marks import marks
from kvscope.ui.pools import pool_panels_figure


def _findings(fatal_t: float = 34.3) -> pd.DataFrame:
    # As on glm5-dsa seed 0: an admission gap and a resume near miss open at the same pass, a
    # second before the failure that ends the run.
    rows = [
        ("time_to_exhaustion", "critical", 26.7, fatal_t, {"critical_at_s": 30.0}),
        ("admission_gap", "critical", 33.0, fatal_t, {}),
        ("resume_near_miss", "warning", 33.0, fatal_t, {}),
        ("engine_fatal", "critical", fatal_t, fatal_t, {}),
    ]
    return pd.DataFrame([{"kind": k, "severity": s, "t_start_s": a, "t_end_s": b, "pools": ["draft"],
                          "request_ids": [24], "evidence": e} for k, s, a, b, e in rows])


def _place(note: dict) -> tuple[float, int]:
    return note["x"], note.get("xshift", 0)


def _vertical(notes: list[dict]) -> list[dict]:
    return [n for n in notes if n.get("textangle") == -90]


@pytest.mark.parametrize("build", ["live", "report"])
def test_labels_of_findings_opening_together_are_set_side_by_side(build):
    ff = _findings()
    _shapes, notes = (marks(ff, (34.3, "engine fatal (request 24)"), xref="x", yref="y domain") if build == "live"
                      else finding_marks(ff))
    labels = _vertical(notes)
    texts = [n["text"] for n in labels]
    assert any("admission_gap" in t for t in texts) and any("resume_near_miss" in t for t in texts), texts
    places = [_place(n) for n in labels]
    assert len(set(places)) == len(places), places
    at_33 = sorted(abs(n.get("xshift", 0)) for n in labels if n["x"] == 33.0)
    assert at_33 == [0, LABEL_STEP_PX], at_33


def test_live_marks_name_the_failure_once_left_of_its_line_and_keep_kind_labels_off_it():
    _shapes, notes = marks(_findings(), (34.3, "engine fatal (request 24)"), xref="x", yref="y domain")
    fatal = [n for n in notes if "fatal" in n["text"]]
    assert [n["text"] for n in fatal] == ["engine fatal (request 24)"]  # not the finding kind besides
    assert fatal[0]["xanchor"] == "right" and fatal[0]["yanchor"] == "top"
    # the vertical kind labels stand at the foot of their lines, the fatal label at the top
    assert all(n["y"] == 0 and n["yanchor"] == "bottom" for n in _vertical(notes))


def test_live_marks_without_a_fatal_line_still_label_the_engine_fatal_finding():
    _shapes, notes = marks(_findings(), None, xref="x", yref="y domain")
    assert "engine_fatal" in [n["text"] for n in notes]


def test_labels_far_apart_keep_their_place():
    notes = [{"x": 0.0, "textangle": -90, "xanchor": "left"}, {"x": 50.0, "textangle": -90, "xanchor": "left"},
             {"x": 100.0, "textangle": -90, "xanchor": "left"}]
    assert all("xshift" not in n for n in spread_labels(notes, 100.0))
    # within 1.5 % of the span they are a cluster, stacked one label width apart, away from the line
    close = [{"x": 10.0, "textangle": -90, "xanchor": "right"}, {"x": 10.5, "textangle": -90, "xanchor": "right"},
             {"x": 11.0, "textangle": -90, "xanchor": "right"}]
    assert [n.get("xshift", 0) for n in spread_labels(close, 100.0)] == [0, -LABEL_STEP_PX, -2 * LABEL_STEP_PX]


def test_a_mode_change_label_beside_a_finding_label_is_set_beside_it_not_over_it():
    # the initial mode is reported at t=0, where the first stalled reservation opens too
    pools = pd.DataFrame({"t_s": [0.0, 24.0], "pool": ["draft", "draft"], "capacity_blocks": [100, 100],
                          "free_blocks": [100, 50], "evictable_blocks": [0, 0], "reserved_blocks": [0, 0],
                          "used_blocks": [0, 50]})
    findings = pd.DataFrame([{"kind": "stalled_reservation", "severity": "warning", "t_start_s": 0.0,
                              "t_end_s": 0.0, "pools": ["draft"], "request_ids": [1], "evidence": {}}])
    fig = pool_panels_figure(pools, findings, switches=[(0.0, "remediation off"), (0.1, "remediation on")])
    labels = [a.to_plotly_json() for a in fig.layout.annotations if a.textangle == -90]
    assert sorted(n["text"] for n in labels) == ["remediation off", "remediation on", "stalled_reservation"]
    places = [(n["x"], n.get("xshift", 0)) for n in labels]
    assert len(set(places)) == 3 and {n["xanchor"] for n in labels} == {"right"}, places


def test_bands_and_marker_lines_are_named_in_the_legend_once_per_figure():
    pools = pd.DataFrame({"t_s": [0.0, 34.3] * 2, "pool": ["target", "target", "draft", "draft"],
                          "capacity_blocks": [100] * 4, "free_blocks": [100, 50] * 2, "evictable_blocks": [0] * 4,
                          "reserved_blocks": [0] * 4, "used_blocks": [0, 50] * 2})
    fig = pool_panels_figure(pools, _findings(), fatal=(34.3, "engine fatal (request 24)"),
                             switches=[(1.0, "remediation shadow")])
    named = [s.name for s in fig.layout.shapes if s.showlegend]
    assert sorted(named) == ["critical finding (span)", "engine fatal", "finding opens", "remediation mode change",
                             "warning finding (span)"], named
