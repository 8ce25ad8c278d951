"""``kvscope replay``: knob listing and summary keys, through the real dispatcher (in process)."""

from __future__ import annotations

import json

from kvscope.cli import main
from kvscope.engine_model.config import EngineConfig


def test_list_knobs_prints_every_knob_with_scenario_default_when_json(capsys):
    assert main(["replay", "--list-knobs", "--scenario", "qwen-hybrid-mtp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    knobs = data["qwen-hybrid-mtp"]
    assert set(knobs) == set(EngineConfig.knob_names())
    assert knobs["num_draft_blocks"] == 22848
    assert knobs["draft_cursor_sizing"] == "prompt"


def test_list_knobs_with_engine_lists_that_engine_only(capsys):
    # --engine picks the engine a trace replays on; its knob listing is that scenario's, not all six.
    assert main(["replay", "--list-knobs", "--engine", "qwen-hybrid-mtp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["qwen-hybrid-mtp"]
    assert data["qwen-hybrid-mtp"]["tokens_per_block"] == 32


def test_list_knobs_table_marks_model_knobs_when_text(capsys):
    assert main(["replay", "--list-knobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["knob", "glm5-dsa"]
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert "[model]" not in by_name["max_util_for_resume"]
    assert by_name["draft_mode"].endswith("[model]")


def test_replay_summary_has_contract_keys_when_json(capsys):
    assert main(["replay", "--scenario", "oversize", "--json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["requests_rejected"] == 1
    assert data["rejection_reasons"] == {"prompt_len > max_seq_len": 1}
    assert data["engine_fatal"] is False and data["fatal_message"] is None
    assert out.err == ""


def _build(scenario: str) -> str:
    """The build text a scenario's default ``engine_version`` reads as (``1.3.0rc25 (v1.3.0rc25 785c948)``)."""
    from kvscope.replay.scenarios import get_scenario

    return get_scenario(scenario).config.engine_build.label


def test_replay_names_the_engine_build_on_its_first_line_and_in_json(capsys):
    for given, version, build in (("1.3.0rc25", "1.3.0rc25", "1.3.0rc25 (v1.3.0rc25 785c948)"),
                                  ("main", "main-00746ef", "main-00746ef (00746ef9992943a9bb604dbf1ecf00c64af58c32)")):
        argv = ["replay", "--scenario", "oversize", "--set", f"engine_version={given}"]
        assert main(argv) == 0
        assert capsys.readouterr().out.splitlines()[0] == f"replay oversize on engine {build}: healthy"
        assert main([*argv, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        # Added beside the knob (never in place of it): the alias is resolved in both.
        assert data["engine_version"] == data["config"]["engine_version"] == version


def test_paired_draft_on_a_build_without_joint_reuse_names_the_builds_that_have_it(capsys):
    # glm5-dsa defaults to 1.3.0rc25 (no joint reuse); the line says which builds have it and the --set.
    assert main(["replay", "--scenario", "glm5-dsa", "--set", "draft_mode=paired"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    err = out.err.strip().splitlines()
    assert len(err) == 1 and "engine_version 1.3.0rc25 does not have" in err[0]
    assert "set engine_version to 1.3.0rc27 or main-00746ef, the builds with it" in err[0]
    assert err[0].endswith("(e.g. --set engine_version=main-00746ef)")


def test_replay_requires_a_source_when_neither_given(capsys):
    assert main(["replay", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kvscope replay: error: give --scenario NAME or --trace PATH (see --help)"]


def test_event_file_names_the_engine_build_the_replay_ran(tmp_path, capsys):
    from kvscope.recording import read_file

    for version in ("1.3.0rc25", "main-00746ef"):
        path = tmp_path / f"{version}.jsonl"
        assert main(["replay", "--scenario", "oversize", "--set", f"engine_version={version}",
                     "--events", str(path), "--json"]) == 0
        meta = read_file(path).attrs["kvscope"]["files"][0]["header"]["meta"]
        assert meta["engine_version"] == f"model-of-{version}"
        assert meta["knobs"]["engine_version"] == version
    capsys.readouterr()


def test_a_trace_of_an_unknown_format_is_refused_as_such_before_anything_is_printed(tmp_path, capsys):
    path = tmp_path / "conversation.txt"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    assert main(["replay", "--trace", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "unknown trace format 'conversation.txt'" in out.err and "scenario" not in out.err


def test_text_summary_says_when_a_healthy_engine_ended_requests_with_an_error(capsys):
    assert main(["replay", "--scenario", "shared-prefix", "--remediation", "joint-admission", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine_fatal"] is False and data["requests_errored"] > 0  # the precondition
    assert main(["replay", "--scenario", "shared-prefix", "--remediation", "joint-admission"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"replay shared-prefix on engine {_build('shared-prefix')}: healthy (the engine served "
                        f"on; {data['requests_errored']} "
                        "requests ended with an error response)")
    assert f"  {'requests_errored':<22} {data['requests_errored']}" in lines


def test_sizing_from_without_sizing_auto_is_refused_not_ignored(capsys):
    from pathlib import Path

    events = str(Path(__file__).parents[1] / "analysis" / "data" / "oversize.parquet")
    for extra in ([], ["--sizing", "4x"]):
        assert main(["replay", "--scenario", "oversize", "--sizing-from", events, *extra, "--json"]) == 2
        out = capsys.readouterr()
        assert out.out == "" and "--sizing-from EVENTS is read only with --sizing auto" in out.err


def test_text_summary_shows_values_not_python_reprs(capsys):
    assert main(["replay", "--scenario", "oversize"]) == 0
    lines = {line.split()[0]: line.split(None, 1)[1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["peak_utilization"].startswith("target ") and lines["peak_utilization"].endswith("%")
    assert lines["sizing"] == "-" and lines["remediation"] == "mode: off, policy: -"
    assert lines["rejected_by_reason"] == "prompt_len > max_seq_len: 1"
    assert not any(c in text for text in lines.values() for c in "{}'") and "None" not in lines.values()


def test_sizing_from_a_recording_of_other_traffic_says_so(tmp_path, capsys):
    events = tmp_path / "oversize.parquet"
    assert main(["replay", "--scenario", "oversize", "--events", str(events), "--json"]) == 0
    capsys.readouterr()
    assert main(["replay", "--scenario", "oversize", "--sizing", "auto", "--sizing-from", str(events), "--json"]) == 0
    assert capsys.readouterr().err == ""  # the same traffic: nothing to say
    assert main(["replay", "--scenario", "near-miss", "--set", "max_requests=4", "--sizing", "auto",
                 "--sizing-from", str(events), "--json"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recorded 'oversize', this replay is 'near-miss'" in err[0]


def test_text_summary_says_how_many_requests_were_unfinished_when_the_replay_stopped_early(capsys):
    argv = ["replay", "--scenario", "mooncake-conversation", "--set", "max_sim_seconds=5"]
    assert main([*argv, "--json"]) == 0
    unfinished = json.loads(capsys.readouterr().out)["requests_unfinished"]
    assert unfinished > 0  # the precondition: the cap stopped the replay with requests in the engine
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (f"  {'requests_unfinished':<22} {unfinished} (still running or queued when the replay stopped)"
            in lines)
    assert main(["replay", "--scenario", "oversize"]) == 0  # every request ended: nothing to say
    assert "requests_unfinished" not in capsys.readouterr().out


def test_engine_is_refused_with_a_scenario_not_ignored(capsys):
    # A scenario brings its own engine configuration: --engine would be silently dropped.
    assert main(["replay", "--scenario", "near-miss", "--engine", "glm5-dsa", "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip().splitlines() == [
        "kvscope replay: error: --engine applies to --trace only (a --scenario replays on its own engine "
        "configuration; change it with --set)"]


def test_a_refused_trace_prints_nothing_on_stdout_and_a_replayed_one_names_its_engine_first(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["replay", "--trace", str(empty)]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # no "replaying ..." line for a replay that never ran
    assert len(out.err.strip().splitlines()) == 1 and "trace holds no requests" in out.err
    trace = tmp_path / "three.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 100, "input_length": 64, "output_length": 2,
                                         "hash_ids": [i]}) + "\n" for i in range(3)))
    assert main(["replay", "--trace", str(trace), "--engine", "near-miss"]) == 0
    lines = capsys.readouterr().out.splitlines()
    build = _build("near-miss")
    assert lines[0] == f"replayed {trace} on the near-miss engine configuration (--engine to choose), engine {build}"
    assert lines[1] == f"replay {trace} on engine {build}: healthy"
    assert main(["replay", "--trace", str(trace), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests_completed"] == 3  # one object, nothing else


def test_list_knobs_table_keeps_values_under_their_headers_when_a_scenario_name_is_wide(capsys):
    from kvscope.engine_model.config import EngineConfig

    assert main(["replay", "--list-knobs"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    names = header.split()[1:-1]
    assert "mooncake-conversation" in names  # wider than the values: the case that drifted
    ends = [header.index(f" {n} ") + 1 + len(n) for n in names]  # right-aligned: columns end together
    description = header.index(" description") + 1
    helps = {name: text for name, text, _ in EngineConfig.describe_knobs()}
    for row in rows:
        for end in ends:
            assert row[end - 1] != " " and row[end] == " ", (row, end)
        assert row[description:].startswith(helps[row.split()[0]]), row
