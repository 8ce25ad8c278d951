"""``MODE[:POLICY]``: one parser for ``kvscope replay --remediation``, ``KVSCOPE_REMEDIATION``, the
launcher's check and the notebook layer, with remediation's own mode and policy names."""

from __future__ import annotations

import pytest

from kvscope.app.remediation_setting import RemediationSetting, parse_remediation_setting
from kvscope.cli import main
from remediation import DEFAULT_POLICY, MODES, POLICIES


@pytest.mark.parametrize(("value", "expected"), [
    ("", ("off", DEFAULT_POLICY)),
    ("  ", ("off", DEFAULT_POLICY)),
    ("Shadow", ("shadow", DEFAULT_POLICY)),
    (" AUTO : Worst-Case ", ("auto", "worst-case")),
    ("joint-admission", ("on", "joint-admission")),
])
def test_reads_a_mode_a_policy_or_both_in_any_case_when_valid(value, expected):
    assert parse_remediation_setting(value) == RemediationSetting(*expected)


def test_takes_every_mode_and_every_registered_policy_when_combined():
    for mode in MODES:
        for policy in POLICIES:
            assert parse_remediation_setting(f"{mode}:{policy}") == (mode, policy)


@pytest.mark.parametrize("value", ["enable", "on:", ":on", "on:draft-reserv", "worst-case:on", "on:worst-case:x"])
def test_refuses_other_forms_in_one_line_naming_the_modes_and_policies_when_invalid(value):
    with pytest.raises(ValueError) as err:
        parse_remediation_setting(value)
    message = str(err.value)
    assert "\n" not in message and message.endswith(f"got {value!r}")
    assert all(name in message for name in (*MODES, *POLICIES))


def test_replay_refuses_a_bad_remediation_setting_naming_the_flag_before_it_runs(capsys):
    assert main(["replay", "--scenario", "shared-prefix", "--remediation", "on:draft-reserv", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--remediation: expected MODE[:POLICY] or POLICY" in err and "got 'on:draft-reserv'" in err


def test_replay_runs_with_a_mode_and_policy_named_together_when_given_mode_colon_policy(capsys):
    import json

    assert main(["replay", "--scenario", "shared-prefix", "--set", "max_requests=8",
                 "--remediation", "shadow:worst-case", "--json"]) == 0
    remediation = json.loads(capsys.readouterr().out)["remediation"]
    assert (remediation["mode"], remediation["policy"]) == ("shadow", "worst-case")
