"""``kvscope replay``: run the CPU engine model on a built-in scenario or a trace file.

    kvscope replay (--scenario NAME | --trace PATH [--engine SCENARIO]) [--set key=value ...] [--json]
                   [--list-scenarios] [--list-knobs] [--list-policies] [--events PATH]
                   [--remediation MODE[:POLICY]|POLICY] [--sizing auto|SHARE|RATIOx]
                   [--scheduler model|installed] [--manager model|installed]

``--json`` prints exactly one JSON object (the ``ReplaySummary``; keys are a public contract and are
never renamed) and nothing else. Without ``--json``, a progress line (simulated time, requests done)
is drawn on stderr when stderr is a terminal and the replay runs longer than a few seconds, then a
readable summary.
``--list-scenarios`` describes the built-in scenarios (also at the end of ``--help``); a ``--trace``
replays on the engine configuration of the scenario ``--engine`` names (glm5-dsa by default, said on
the first line of the readable output, printed once the replay has run). ``--list-knobs`` prints every knob with its default for the chosen scenario (all scenarios without
one) and the range ``--set`` accepts. ``--events PATH`` writes the replay's event file through
:func:`kvscope.app.session.instrument_replay` (the callable ``replay.run`` receives as ``instrument=``).

``--remediation`` attaches remediation before the loop (:mod:`kvscope.app.remedy`): a mode with the
default policy, a policy name (mode ``on``) or ``MODE:POLICY``
(:mod:`kvscope.app.remediation_setting`); ``--list-policies`` prints them. ``--sizing`` splits
the KV byte budget between target and draft before the engine starts: ``auto`` (from observed peak
usage: a recorded run given with ``--sizing-from EVENTS``, else a probe replay with the draft pool
out of the way), a draft byte share (``0.09``) or
a draft-to-target token ratio (``4x``). ``KVSCOPE_REMEDIATION_CHANNEL=PATH`` (and ``KVSCOPE_RANK``) attach
remediation to a shared control file even when off, so several ranks switch on the same iteration.
Under ``kvscope-instrument`` the instrumentation records the replay and owns remediation (its own
``KVSCOPE_REMEDIATION`` / ``KVSCOPE_REMEDIATION_CHANNEL``): ``--events`` and ``--remediation`` are
refused there, and the summary reports the instrumentation's controller.
``--scheduler installed`` / ``--manager installed`` run the installed TensorRT-LLM's
``KVCacheV2Scheduler`` / ``KVCacheManagerV2`` in place of the model's (:mod:`kvscope.engines.trtllm.installed`;
the model keeps the executor loop and the forward pass's timing); a build without the seams kvscope
records, or none at all, is refused in one line, and ``--json`` gains ``installed``.
The readable summary's first line names the engine build (``engine_version`` and its release or
commit); ``--json`` always carries ``engine_version``, ``remediation``, ``sizing``,
``reservations_leaked``, ``requests_contained``, ``rejected_by_reason`` and ``deferrals``.

The listings (``--list-scenarios``, ``--list-knobs``, ``--list-policies``, ``--describe-build``) are
:mod:`kvscope.commands._replay_listings`'s; the readable summary is
:mod:`kvscope.commands._replay_text`'s. This module checks the flags together before anything runs
(each refusal names the flags that clash) and composes the replay.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kvscope import replay as replay_mod
from kvscope.app import hosted, remedy, sizing
from kvscope.app.remediation_setting import parse_remediation_setting
from kvscope.app.session import instrument_replay
from kvscope.commands import _replay_listings as listings
from kvscope.commands._progress import ProgressLine
from kvscope.commands._replay_text import build_label, print_summary
from kvscope.engine_model.config import EngineConfig
from kvscope.replay.scenarios import SCENARIOS, get_scenario

TRACE_ENGINE = "glm5-dsa"
"""The scenario whose engine configuration a ``--trace`` replays on unless ``--engine`` names another."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay a scenario or trace on the CPU engine model",
        description="Replay a built-in scenario or a trace on the CPU model of TensorRT-LLM's KV cache "
                    "manager V2, scheduler and executor loop.",
        epilog=listings.scenarios_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--scenario", choices=sorted(SCENARIOS), help="built-in scenario (see below)")
    source.add_argument("--trace", metavar="PATH",
                        help="trace file: Mooncake .jsonl (open loop) or kv-cache-tester .tar.xz (closed loop)")
    # No default here: run() must tell "not given" from "given with --scenario" to refuse the latter.
    parser.add_argument("--engine", metavar="SCENARIO", default=None, choices=sorted(SCENARIOS),
                        help=f"with --trace: replay on this built-in scenario's engine configuration "
                             f"(default: {TRACE_ENGINE}); --set changes it further")
    parser.add_argument("--list-scenarios", action="store_true", help="describe the built-in scenarios")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a knob (repeatable); see --list-knobs")
    parser.add_argument("--json", action="store_true", help="print one JSON summary object only")
    parser.add_argument("--list-knobs", action="store_true", help="print the knobs and their defaults")
    parser.add_argument("--describe-build", action="store_true",
                        help="print the engine build in force (the scenario's, or --set engine_version=...): each "
                             "behaviour, and whether it was read at the build's code or inferred, and from what")
    parser.add_argument("--events", metavar="PATH", help="write the replay's event file (needs instrumentation)")
    parser.add_argument("--remediation", default="off", metavar="MODE|POLICY",
                        help="off (default), shadow, on, auto, a policy name (on), or MODE:POLICY; see --list-policies")
    parser.add_argument("--sizing", metavar="auto|SHARE|RATIOx",
                        help="split the KV byte budget at start: auto, a draft byte share (0.09) or a token ratio (4x)")
    parser.add_argument("--sizing-from", metavar="EVENTS", nargs="+",
                        help="with --sizing auto: size from this recorded run's peak pool usage "
                             "(default: a probe replay of the same traffic with the draft pool out of the way)")
    parser.add_argument("--list-policies", action="store_true", help="print the admission policies")
    parser.add_argument("--scheduler", choices=("model", "installed"), default="model",
                        help="model (default) or installed: run the installed TensorRT-LLM's KVCacheV2Scheduler")
    parser.add_argument("--manager", choices=("model", "installed"), default="model",
                        help="model (default) or installed: run the installed TensorRT-LLM's KVCacheManagerV2 "
                             "(on the GPU, or decisions-only on CPU; needs --scheduler installed)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if _print_listing(args):
        return 0
    _check_flags(args)
    engine = getattr(args, "engine", None) or TRACE_ENGINE
    source = args.scenario or args.trace
    # A trace says nothing about the engine: it replays on a named scenario's configuration.
    engine_config = get_scenario(engine).config if args.trace else None
    try:
        mode, policy = parse_remediation_setting(getattr(args, "remediation", "off") or "off")
    except ValueError as e:
        raise ValueError(f"--remediation: {e}") from None
    # Checked before anything runs: a build without kvscope's seams is refused in one line.
    installed_build = _installed_build(args)
    overrides, plan = _sized_overrides(args, engine_config, source)
    session, instrument, mode, policy = _instrumentation(args, source, mode, policy)
    swap = None
    if installed_build is not None:
        from kvscope.engines.trtllm.swap import InstalledSwap

        swap = InstalledSwap(installed_build, instrument)
    progress = ProgressLine.on_terminal(quiet=args.json)
    try:
        summary = replay_mod.run(source, overrides, config=engine_config, instrument=swap or instrument,
                                 progress=progress)
    finally:
        if progress is not None:
            progress.close()
    stats = session.final_stats if session is not None else None
    if stats:
        remedy.apply_rejections(summary, stats)
    data = summary.to_dict()
    data.update(remedy.summary_keys(stats, summary, sizing=plan, mode=mode, policy=policy))
    if swap is not None:
        data["installed"] = {**swap.build.describe(), "model_knobs_not_passed": swap.not_passed}
    status = _add_recording(data, instrument, args.events)
    if args.json:
        # Strict JSON: a NaN would be refused by strict parsers, so it is an error here, not output.
        sys.stdout.write(json.dumps(data, sort_keys=True, allow_nan=False) + "\n")
    else:
        if args.trace:
            # Said once the replay has run, not before: a trace is read lazily inside the loop, so an
            # empty or malformed one is refused there, and a refused replay prints nothing on stdout.
            print(f"replayed {args.trace} on the {engine} engine configuration (--engine to choose), "
                  f"engine {build_label(data['engine_version'])}")
        print_summary(data)
    return status


def _print_listing(args: argparse.Namespace) -> bool:
    """Print what ``--list-scenarios``, ``--describe-build``, ``--list-knobs`` or ``--list-policies``
    asks for (the first given, in that order); False when none is given."""
    if getattr(args, "list_scenarios", False):
        listings.print_scenarios(as_json=args.json)
    elif getattr(args, "describe_build", False):
        source = args.scenario or getattr(args, "engine", None) or TRACE_ENGINE
        listings.describe_build(source, args.overrides, as_json=args.json)
    elif args.list_knobs:
        # --engine names a scenario's engine (with --trace): its knobs are that scenario's.
        listings.print_knobs(args.scenario or getattr(args, "engine", None), as_json=args.json)
    elif getattr(args, "list_policies", False):
        listings.print_policies(as_json=args.json)
    else:
        return False
    return True


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that clash or inputs that cannot be read, before anything runs.

    Raises:
        ValueError: one line naming the flags (or the path) at fault.
    """
    if not args.scenario and not args.trace:
        raise ValueError("give --scenario NAME or --trace PATH (see --help)")
    if getattr(args, "engine", None) and not args.trace:
        # A scenario brings its own engine configuration; an --engine beside it would be dropped.
        raise ValueError("--engine applies to --trace only (a --scenario replays on its own engine "
                         "configuration; change it with --set)")
    if getattr(args, "sizing_from", None) and (getattr(args, "sizing", None) or "").strip().lower() != "auto":
        # Read only to size from a recording: given with another plan (or none) it would be ignored.
        raise ValueError("--sizing-from EVENTS is read only with --sizing auto")
    if args.events:
        inputs = ([("--trace", args.trace)] if args.trace else []) + [
            ("--sizing-from", p) for p in getattr(args, "sizing_from", None) or []]
        _check_events_path(args.events, inputs)
    if args.trace and not os.path.isfile(args.trace):
        why = "is a directory, not a trace file" if os.path.isdir(args.trace) else "no such trace file"
        raise ValueError(f"{args.trace}: {why}")
    if args.trace:
        replay_mod.resolve(args.trace)  # an unknown trace format is refused before anything is printed


def _sized_overrides(args: argparse.Namespace, engine_config: EngineConfig | None,
                     source: str) -> tuple[list[str], Any]:
    """``--set`` overrides, plus the pool sizes ``--sizing`` plans (and that plan; None without it)."""
    overrides = list(args.overrides)
    if not getattr(args, "sizing", None):
        return overrides, None
    base = engine_config or replay_mod.resolve(source)[0]
    config = base.with_overrides(overrides)
    observed = None
    if args.sizing.strip().lower() == "auto":
        if getattr(args, "sizing_from", None):
            from kvscope.recording import read_frame

            recorded = read_frame(args.sizing_from)  # read once: its header, then its snapshots
            _warn_if_other_traffic(recorded, args.sizing_from[0], source)
            observed = sizing.observed_from_events(recorded)
        else:
            observed = sizing.observe_for_sizing(source, overrides)
    _, plan = sizing.sized_config(config, args.sizing, observed=observed)
    overrides += [f"num_target_blocks={plan.target_blocks}", f"num_draft_blocks={plan.draft_blocks}"]
    return overrides, plan


def _instrumentation(args: argparse.Namespace, source: str, mode: str,
                     policy: str) -> tuple[Any, Any, str, str]:
    """``(session, instrument, mode, policy)``: the remediation session (None without one), the
    callable ``replay.run`` receives as ``instrument=``, and the remediation in force (under
    ``kvscope-instrument``, the instrumentation's).

    Raises:
        ValueError: ``--events`` or ``--remediation`` under ``kvscope-instrument``.
    """
    session: Any = None
    channel_path = os.environ.get("KVSCOPE_REMEDIATION_CHANNEL", "").strip()
    is_hosted, hosted_ctl = hosted.hosted_controller()
    if is_hosted:
        # Under kvscope-instrument the instrumentation records this engine and owns its remediation
        # (it read KVSCOPE_REMEDIATION and KVSCOPE_REMEDIATION_CHANNEL at start): a second session
        # here would instrument the model twice.
        if args.events:
            raise ValueError("the engine model is already instrumented in this process (kvscope-instrument); "
                             "its events go to that instrumentation's files, so --events cannot be honoured")
        if mode != "off":
            raise ValueError("under kvscope-instrument remediation is attached by the instrumentation: set "
                             "KVSCOPE_REMEDIATION=MODE[:POLICY] (and KVSCOPE_REMEDIATION_CHANNEL) instead of "
                             "--remediation")
        session = hosted.HostedRemediation(hosted_ctl)
        return session, session, session.mode, session.policy
    if mode != "off" or channel_path:
        # With a control channel (several ranks replaying alike) remediation stays attached while off,
        # so a change published there applies at its iteration.
        channel = remedy.FileControlChannel(channel_path) if channel_path else None
        rank = int(os.environ.get("KVSCOPE_RANK", "0") or 0)
        session = remedy.RemediatedSession(mode=mode, policy=policy, events_path=args.events, label=source,
                                           channel=channel, rank=rank)
        return session, session, mode, policy
    return None, instrument_replay(args.events, label=source) if args.events else None, mode, policy


def _add_recording(data: dict[str, Any], instrument: Any, events_path: str | None) -> int:
    """Add the ``events`` key (what the recording wrote and lost) to ``data``; the exit status: 1
    when events were dropped or a sink failed (one warning line on stderr), else 0."""
    recording = _recording_facts(instrument, events_path)
    if recording is None:
        return 0
    data["events"] = recording
    if not (recording["dropped"] or recording["sink_errors"]):
        return 0
    # A Parquet recording that could not close is still its .partial stream: name that file.
    partial = _partial_path(events_path)
    kept = str(partial) if partial is not None and partial.exists() else events_path
    print(f"kvscope replay: warning: event file {kept}: {recording['dropped']} event(s) dropped, "
          f"{recording['sink_errors']} sink error(s) ({recording['why']}); what was written before "
          "stays readable", file=sys.stderr)
    return 1


def _installed_build(args: argparse.Namespace) -> Any:
    """The installed TensorRT-LLM classes ``--scheduler`` / ``--manager`` ask for (None: the model's).

    Raises:
        ValueError: one line, when they cannot run (not importable, seams missing).
    """
    scheduler, manager = getattr(args, "scheduler", "model"), getattr(args, "manager", "model")
    if (scheduler, manager) == ("model", "model"):
        return None
    if hosted.hosted_controller()[0]:
        raise ValueError("under kvscope-instrument the engine model is instrumented in this process; "
                         "--scheduler/--manager installed replays outside it")
    from kvscope.engines.trtllm.installed import resolve

    return resolve(scheduler, manager)


def _recording_facts(instrument: Any, path: str | None) -> dict[str, Any] | None:
    """``--json`` key ``events``: what the recording wrote and lost (ring or sink)."""
    session = getattr(instrument, "session", instrument)  # a remediated session wraps the file session
    pump = getattr(session, "pump", None)
    if path is None or pump is None:
        return None
    sink_drops = dict(getattr(pump, "dropped_by_sink", {}) or {})
    ring = int(getattr(session, "dropped", 0) or 0)
    why = ", ".join([f"{name} failed" for name in sink_drops] + (["recorder ring full"] if ring else []))
    # No path here: ranks of one run print comparable summaries (the path is the caller's own flag).
    return {"recorded": int(pump.num_exported), "dropped": ring + sum(sink_drops.values()),
            "sink_errors": int(pump.sink_errors), "why": why or None}


def _warn_if_other_traffic(frame: Any, path: str, source: str) -> None:
    """One line on stderr when the recording sizing a replay was made of other traffic (its file
    header names another scenario or trace): the plan is then another workload's, which may be the
    intent (sizing for production traffic recorded elsewhere) but is never silent."""
    header = frame.attrs.get("kvscope", {}).get("files", [{}])[0].get("header") or {}
    recorded = (header.get("meta") or {}).get("scenario")
    if recorded and str(recorded) != str(source):
        print(f"kvscope replay: warning: --sizing-from {path} recorded {recorded!r}, this replay is "
              f"{source!r}: the pools are sized for the traffic recorded there", file=sys.stderr)


def _check_events_path(path: str, inputs: list[tuple[str, str]]) -> None:
    """Refuse, before the replay starts, an event file path that cannot be written or that is one of
    the replay's inputs (``(flag, path)`` pairs): recording there would destroy the input."""
    from kvscope.app.inputs import check_output_not_input
    from kvscope.recording.files import check_writable

    partial = _partial_path(path)  # the suffix names the format: refused here, not after the replay
    check_output_not_input("--events", path, inputs, written=[partial] if partial else [])
    check_writable(path)


def _partial_path(path: str) -> Any:
    """The ``.partial`` stream a Parquet recording is written through (None for JSON Lines)."""
    from kvscope.recording import sink_for_path

    return getattr(sink_for_path(path), "partial_path", None)
