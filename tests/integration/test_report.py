"""The HTML report on real replays: the incident first, every request drawable.

- The Mooncake conversation trace on main-00746ef without a host tier (the replay the issue
  describes: 624 requests, request 611 crashes the engine, 228 fail): the request timeline
  includes request 611 and every failed request, failed requests have a legend entry, and the
  report leads with the verdict and the engine's whole message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.analysis import analyze_files
from kvscope.analysis.report import render_html
from kvscope.ui.figures import request_timeline_figure

pytestmark = pytest.mark.slow


def _traces() -> Path:
    env = os.environ.get("KVSCOPE_TRACES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "traces"


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


def test_mooncake_conversation_timeline_includes_the_failing_request_611(mooncake):
    summary, a = mooncake
    assert summary["engine_fatal"] is True and summary["fatal_request_id"] == 611
    fig = request_timeline_figure(a.timeline, always=(611,))
    drawn = {y for t in fig.data for y in t.y}
    assert "611" in drawn
    failed = {str(r) for r in a.timeline.index[a.timeline["outcome"].astype(str) == "failed"]}
    assert len(failed) == summary["requests_failed"] and failed <= drawn
    assert "failed" in {t.name for t in fig.data if t.showlegend is not False}


def test_report_leads_with_the_verdict_and_the_whole_message(mooncake):
    summary, a = mooncake
    text = render_html(a, [request_timeline_figure(a.timeline, always=(611,))], title="mooncake")
    head = text[: text.index("Findings (")]
    assert "ENGINE FATAL at t=" in head and "request 611, draft pool" in head
    assert summary["fatal_message"] in text  # whole, not cut
    assert "First warning that named request 611" in head
