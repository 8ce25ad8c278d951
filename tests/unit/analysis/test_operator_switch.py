"""``kvscope analyze`` of a run whose remediation the operator switched by hand: the verdict says
when the switch took (or that it was refused), in text, JSON and HTML (an on-call walkthrough found
the run read as if nothing had been done, where an auto switch is named)."""

from __future__ import annotations

import json

from kvscope.analysis import analyze_files
from kvscope.analysis.report import render_html
from kvscope.cli import main
from remediation import ControlRecord


def test_a_switch_in_the_running_engine_is_named_in_the_verdict(replay_with_control, capsys):
    events, summary = replay_with_control(ControlRecord(1, "on", None, at_iteration=6))
    assert not summary["engine_fatal"] and summary["remediation"]["mode"] == "on"
    a = analyze_files(events)
    sw = a.verdict()["remediation_switched"]
    assert sw["iteration"] >= 6 and (sw["mode"], sw["policy"]) == ("on", "draft-headroom")
    assert a.verdict()["status"] == "healthy" and "remediation_refused" not in a.verdict()
    assert (f"remediation switched on in the running engine at iteration {sw['iteration']} "
            "(mode on, policy draft-headroom)") in a.headline()
    assert main(["analyze", str(events), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["remediation_switched"] == sw
    page = render_html(a)
    assert f"Remediation switched on in the running engine at iteration {sw['iteration']}" in page
    assert page.index("HEALTHY") < page.index("switched on in the running engine")


def test_a_run_started_with_remediation_on_names_no_switch(tmp_path, capsys):
    events = tmp_path / "on.parquet"
    assert main(["replay", "--scenario", "shared-prefix", "--remediation", "on", "--events", str(events)]) == 0
    capsys.readouterr()
    a = analyze_files(events)
    assert "remediation_switched" not in a.verdict() and "switched on" not in a.headline()


def test_a_refused_control_record_says_the_switch_did_not_take(replay_with_control):
    events, summary = replay_with_control(text='{"seq": 1, "mode": "enable"}')
    assert summary["remediation"]["control_errors"] == 1
    a = analyze_files(events)
    ref = a.verdict()["remediation_refused"]
    assert (ref["refused"], ref["count"]) == ("unknown mode", 1)
    assert a.headline().startswith("ENGINE FATAL")  # the verdict leads; the refusal follows it
    assert f"1 remediation control record(s) refused, the first at iteration {ref['iteration']} (unknown mode): " \
           "that switch did not take" in a.headline()
    assert "remediation_switched" not in a.verdict()
    page = render_html(a)
    assert page.index("ENGINE FATAL") < page.index("remediation control record(s) refused")
