"""``kvscope replay --set``: a knob value out of its range is a bad input (exit 2, one line with the
range), not an internal error; ``--list-knobs`` shows each knob's range."""

from __future__ import annotations

from kvscope.cli import main


def test_a_huge_knob_value_is_exit_2_with_the_range_not_an_internal_error(capsys):
    assert main(["replay", "--scenario", "oversize", "--set", "max_batch_size=1e30"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "kvscope replay: error: max_batch_size must be in [1, 65536], got 1e+30\n"


def test_an_unknown_knob_suggests_the_nearest_one(capsys):
    assert main(["replay", "--scenario", "oversize", "--set", "max_batchsize=8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope replay: error: unknown knob 'max_batchsize'; valid knobs: max_batch_size ")
    assert err.count("\n") == 1 and "seed" not in err


def test_list_knobs_shows_the_range_of_each_knob(capsys):
    assert main(["replay", "--list-knobs", "--scenario", "oversize"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["knob", "oversize", "range", "description"]
    by_name = {row.split()[0]: row for row in rows}
    assert " [1, 65536]  requests per iteration" in by_name["max_batch_size"]
    assert " (0, 1]  resume refused" in by_name["max_util_for_resume"]
    assert " -  prefix block reuse" in by_name["enable_block_reuse"]
