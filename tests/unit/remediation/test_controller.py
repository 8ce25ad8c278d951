from __future__ import annotations

import pytest
from remediation_helpers import FakePort, make_request, make_view

from kvscope.events import EventKind, PoolRole, parse_kv
from kvscope.port import Verdict
from remediation import FileControlChannel, attach, list_policies


def _fill(ctl, it: int, n: int = 6) -> list[Verdict]:
    ctl.begin_pass(make_view(it))
    return [ctl.decide(make_request(rid)).verdict for rid in range(1, n + 1)]


def test_on_applies_the_policy_from_the_first_pass_and_records_the_mode_change():
    port = FakePort()
    ctl = attach(port, mode="on")
    assert port.policy is ctl and port.containment is ctl.containment
    assert ctl.mode == "off"  # pending until the first pass
    assert _fill(ctl, 0) == [Verdict.ADMIT] * 4 + [Verdict.DEFER] * 2
    assert ctl.mode == "on" and ctl.enforcing
    changed = [e for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED]
    assert parse_kv(changed[0].reason) == {"mode": "on", "policy": "draft-headroom", "previous": "off",
                                          "previous_policy": "draft-headroom", "enforcing": 1}
    stats = ctl.stats()
    assert stats.reserved_blocks == {"draft": 16} and stats.live_reservations == 4
    assert (stats.deferral_decisions, stats.requests_deferred) == (2, 2)


def test_shadow_admits_everything_and_records_what_it_would_have_deferred_once_per_request():
    port = FakePort()
    ctl = attach(port, mode="shadow")
    assert _fill(ctl, 0) == [Verdict.ADMIT] * 6
    ctl.begin_pass(make_view(1))
    assert ctl.decide(make_request(5)).verdict is Verdict.ADMIT
    shadowed = [e for e in port.events if e.kind is EventKind.REMEDIATION_SHADOWED]
    assert [(e.request_id, e.pool, e.num_blocks) for e in shadowed] == [(5, PoolRole.DRAFT, 1), (6, PoolRole.DRAFT, 1)]
    assert all(e.reason.startswith("would defer: draft-headroom") for e in shadowed)
    assert EventKind.RESERVATION_MADE not in [e.kind for e in port.events]
    assert ctl.stats().shadow_would_defer == 2 and ctl.stats().reserved_blocks == {}
    assert not ctl.containment.should_contain(1, "Draft KV cache resume failed for request 1")


def test_switching_off_releases_every_reservation_and_uninstalls_the_gate():
    port = FakePort()
    ctl = attach(port, mode="on")
    _fill(ctl, 0)
    ctl.set_mode("off")
    ctl.begin_pass(make_view(1))
    released = [e for e in port.events if e.kind is EventKind.RESERVATION_RELEASED]
    assert sorted(e.request_id for e in released) == [1, 2, 3, 4]
    assert port.policy is None and ctl.stats().live_reservations == 0
    off = [e for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED][-1]
    assert off.num_blocks == 4 and off.num_tokens == 1
    ctl.set_mode("on")  # reinstalls itself to apply the change at the next pass
    assert port.policy is ctl


def test_switching_on_mid_run_adopts_the_requests_already_running():
    port = FakePort()
    ctl = attach(port, mode="off")
    ctl.begin_pass(make_view(0))
    assert port.policy is None  # off without a channel costs one branch in the hook
    ctl.set_mode("on", at_iteration=7)
    running = [make_request(1, first=False, position=8), make_request(2, first=False, position=4)]
    for it in (5, 6):
        ctl.begin_pass(make_view(it, started=running))
        assert ctl.mode == "off"
    ctl.begin_pass(make_view(7, started=running))
    assert ctl.mode == "on" and ctl.stats().reserved_blocks == {"draft": 8}
    assert ctl.decide(make_request(3)).is_admit and ctl.decide(make_request(4)).is_admit
    assert ctl.decide(make_request(5)).verdict is Verdict.DEFER


def test_auto_records_like_shadow_until_triggered_then_enforces():
    port = FakePort()
    ctl = attach(port, mode="auto")
    assert _fill(ctl, 0, 4) == [Verdict.ADMIT] * 4  # 4 x 4 blocks fit below the ceiling: nothing to say
    assert not ctl.enforcing
    ctl.trigger("admission_gap finding")
    ctl.begin_pass(make_view(1, started=[make_request(r, first=False, position=4) for r in range(1, 5)]))
    assert ctl.mode == "auto" and ctl.enforcing and ctl.stats().auto_triggered
    assert ctl.decide(make_request(9)).verdict is Verdict.DEFER  # the 4 running hold 16 blocks
    change = [e for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED][-1]
    assert parse_kv(change.reason)["trigger"] == "admission_gap_finding"
    assert ctl.containment.should_contain(1, "x")


def test_auto_engages_at_the_first_attempt_its_policy_would_defer_within_the_same_pass():
    # A burst of long prompts can fill the draft pool within one pass, before any finding lands: the
    # policy's own deferral (its certain needs pass the ceiling) is the trigger, and it holds at once.
    port = FakePort()
    ctl = attach(port, mode="auto")
    assert _fill(ctl, 0) == [Verdict.ADMIT] * 4 + [Verdict.DEFER] * 2  # 4 x 4 blocks, then 19 < 20
    assert ctl.enforcing and ctl.stats().auto_triggered
    change = [e for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED][-1]
    fields = parse_kv(change.reason)
    assert (fields["mode"], fields["enforcing"]) == ("auto", 1)
    assert fields["trigger"].startswith("draft-headroom_would_defer_request_5")
    assert ctl.stats().shadow_would_defer == 0  # never admitted past what it said


def test_a_shared_channel_makes_two_ranks_switch_on_the_same_iteration(tmp_path):
    path = tmp_path / "control.json"
    ranks = [attach(FakePort(), mode="off", channel=FileControlChannel(path), lead_passes=4) for _ in range(2)]
    for ctl in ranks:
        ctl.begin_pass(make_view(0))
    ranks[0].port.iteration = 10
    ranks[0].set_mode("on")  # published for iteration 14
    switched = {}
    for it in range(10, 20):
        for r, ctl in enumerate(ranks):
            ctl.begin_pass(make_view(it))
            if ctl.mode == "on" and r not in switched:
                switched[r] = it
    assert switched == {0: 14, 1: 14}
    assert [c.stats().late_changes for c in ranks] == [0, 0]


def test_refuses_unknown_modes_and_policies():
    with pytest.raises(ValueError, match="mode must be one of off, shadow, on, auto"):
        attach(FakePort(), mode="maybe")
    ctl = attach(FakePort(), mode="off")
    with pytest.raises(ValueError, match="unknown admission policy"):
        ctl.set_policy("nope")
    assert list(list_policies()) == ["draft-headroom", "draft-reserve", "worst-case", "joint-admission"]


def test_set_policy_starts_a_fresh_ledger_from_the_running_requests():
    port = FakePort()
    ctl = attach(port, mode="on", max_seq_len=32)
    _fill(ctl, 0)
    ctl.set_policy("worst-case")
    ctl.begin_pass(make_view(1, started=[make_request(1, first=False, position=4)]))
    assert ctl.policy_name == "worst-case" and ctl.stats().reserved_blocks == {"draft": 9}


def test_switched_on_before_the_first_pass_of_an_engine_started_off_it_stays_installed_and_enforces():
    # The starting "off" and the switch to "on" are both applied at the first pass: the off must
    # not leave the gate uninstalled while the controller says it enforces.
    port = FakePort()
    ctl = attach(port, mode="off")
    ctl.set_mode("on")
    assert _fill(ctl, 0) == [Verdict.ADMIT] * 4 + [Verdict.DEFER] * 2
    assert ctl.mode == "on" and ctl.enforcing and port.policy is ctl
    modes = [parse_kv(e.reason)["mode"] for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED]
    assert modes == ["off", "on"]


def test_a_mode_change_listener_hears_each_applied_change_as_its_event_says_it_and_never_breaks_a_pass():
    port = FakePort()
    ctl = attach(port, mode="on")
    heard: list[str] = []
    ctl.on_mode_change = heard.append
    _fill(ctl, 0)
    ctl.set_mode("shadow")
    ctl.begin_pass(make_view(1))
    changed = [e.reason for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED]
    assert heard == changed and [parse_kv(r)["mode"] for r in heard] == ["on", "shadow"]

    def broken(_reason: str) -> None:
        raise RuntimeError("listener down")

    ctl.on_mode_change = broken
    ctl.set_mode("on")
    errors = ctl.num_hook_errors
    assert _fill(ctl, 2) == [Verdict.ADMIT] * 4 + [Verdict.DEFER] * 2  # the pass went on, enforcing
    assert ctl.mode == "on" and ctl.num_hook_errors == errors + 1
