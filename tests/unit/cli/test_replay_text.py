"""``kvscope replay`` text: numbers rounded for reading; ``--json`` keeps the values themselves."""

from __future__ import annotations

import json
import re

import pytest

from kvscope import replay
from kvscope.cli import main
from kvscope.commands._replay_text import value_text


@pytest.mark.parametrize(("value", "text"), [
    (34.318376, "34.32"), (6.840530000000001, "6.84"), (284.08169, "284.1"), (0.049205, "0.0492"),
    (0.0, "0"), (12345.678, "12345.7"),
])
def test_a_fractional_number_reads_rounded(value, text):
    assert value_text("sim_seconds", value) == text
    assert value_text("trigger", {"lead_s": value}) == f"lead_s: {text}"  # nested ones too


def test_the_summary_prints_rounded_numbers_and_json_keeps_them_whole(capsys):
    assert main(["replay", "--scenario", "oversize"]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[1:])
    assert main(["replay", "--scenario", "oversize", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("sim_seconds", "goodput_tokens_per_s", "mean_running_requests", "queue_wait_p99_s"):
        assert re.fullmatch(r"-?\d+(\.\d{1,3})?", rows[key]), (key, rows[key])
        assert float(rows[key]) == pytest.approx(data[key], rel=5e-3, abs=1e-3)
    assert rows["prefix_hit_rate"] == f"{data['prefix_hit_rate']:.1%}"
    summary = replay.run("oversize", []).to_dict()  # the values themselves, unrounded
    assert {k: data[k] for k in ("sim_seconds", "prefix_hit_rate")} == {
        k: summary[k] for k in ("sim_seconds", "prefix_hit_rate")}
