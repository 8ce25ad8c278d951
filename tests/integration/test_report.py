"""The HTML report on real replays: the incident first, every request drawable.

- The Mooncake conversation trace on main-00746ef without a host tier (the replay the issue
  describes, where request 611 crashed the engine; the current model crashes it earlier): the
  request timeline draws the failing request and every failed request, also when there are more
  requests than it draws, failed requests have a legend entry, and the report leads with the
  verdict and the engine's whole message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.analysis import analyze_files
from kvscope.analysis.report import render_html
from kvscope.replay.scenarios import TRACES_DIR
from kvscope.ui.figures import request_timeline_figure

pytestmark = pytest.mark.slow


def _traces() -> Path:
    return TRACES_DIR


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    path = tmp_path_factory.mktemp("mooncake") / "conversation.parquet"
    cmd = [sys.executable, "-m", "kvscope", "replay", "--trace", str(_traces() / "conversation_trace.jsonl"),
           "--set", "engine_version=main-00746ef", "--set", "num_host_blocks=0",
           # one micro-batch in flight, as the model ran it when the issue was written (with the
           # scenario's two micro-batches the same trace fails at request 38)
           "--set", "pp_size=1", "--json", "--events", str(path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout), analyze_files(path)


def test_mooncake_conversation_timeline_draws_the_failing_request_and_every_failure(mooncake):
    summary, a = mooncake
    assert summary["engine_fatal"] is True
    failing = summary["fatal_request_id"]
    failed = {str(r) for r in a.timeline.index[a.timeline["outcome"].astype(str) == "failed"]}
    assert len(failed) == summary["requests_failed"] > 0
    for cap in (1000, 10):  # every request; and over the cap, failures and the failing one still drawn
        fig = request_timeline_figure(a.timeline, max_requests=cap, always=(failing,))
        drawn = {y for t in fig.data for y in t.y}
        assert str(failing) in drawn and failed <= drawn
        assert "failed" in {t.name for t in fig.data if t.showlegend is not False}
    assert "showing" in fig.layout.title.text


def test_report_leads_with_the_verdict_and_the_whole_message(mooncake):
    summary, a = mooncake
    failing = summary["fatal_request_id"]
    text = render_html(a, [request_timeline_figure(a.timeline, always=(failing,))], title="mooncake")
    head = text[: text.index("Findings (")]
    assert "ENGINE FATAL at t=" in head and f"request {failing}, draft pool" in head
    assert summary["fatal_message"] in text  # whole, not cut
    # the first warning that named it, or plainly that none did
    assert f"named request {failing}" in head and "First warning" in head
