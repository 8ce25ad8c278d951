"""``kvscope remediation``: the live switch of a running engine, through its control file.

    kvscope remediation set --channel PATH MODE[:POLICY] [--policy NAME] [--at-iteration N] [--json]
    kvscope remediation status --channel PATH [--json]

The engine must have been started with ``KVSCOPE_REMEDIATION_CHANNEL=PATH`` (``kvscope replay`` or
``kvscope-instrument``); every rank reads the file once per scheduling pass and applies the record at
its next pass (or at ``--at-iteration``). ``set`` reads its setting as ``--remediation`` and
``KVSCOPE_REMEDIATION`` do (``MODE``, ``MODE:POLICY`` or ``POLICY``, any case; one parser,
``app.remediation_setting``), with ``--policy`` as the other way to name the policy; a bare ``MODE``
keeps the engine's policy. It checks the names before it writes, and writes the file atomically with the next ``seq``. ``status`` prints what the file asks
for; what each rank applied is in its events (``remediation_mode_changed``) and its summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from kvscope.app.remediation_setting import parse_remediation_setting
from remediation import (
    MODES,
    POLICIES,
    ControlRecord,
    ControlRecordError,
    FileControlChannel,
    check_record,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "remediation", help="switch remediation of a running engine through its control file",
        description="Publish or read a remediation switch on the control file a running engine reads "
                    "(KVSCOPE_REMEDIATION_CHANNEL).")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    set_p = sub.add_parser("set", help="publish a mode (and policy) change")
    set_p.add_argument("--channel", required=True, metavar="PATH", help="the engine's KVSCOPE_REMEDIATION_CHANNEL")
    set_p.add_argument("mode", metavar="MODE[:POLICY]",
                       help=f"mode ({', '.join(MODES)}), optionally with its policy after a colon, as --remediation")
    set_p.add_argument("--policy", metavar="NAME",
                       help=f"admission policy ({', '.join(POLICIES)}); default: the one MODE:POLICY names, else keep")
    set_p.add_argument("--at-iteration", type=int, default=-1, metavar="N",
                       help="scheduler iteration at which every rank applies it (default: each rank's next pass)")
    set_p.add_argument("--json", action="store_true", help="print the published record as one JSON object")
    status_p = sub.add_parser("status", help="print what the control file asks for")
    status_p.add_argument("--channel", required=True, metavar="PATH", help="the engine's KVSCOPE_REMEDIATION_CHANNEL")
    status_p.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def _name(value: str, names: tuple[str, ...] | list[str], what: str, plural: str) -> str:
    name = value.strip().lower()
    if name not in names:
        raise ValueError(f"unknown {what} {value!r}; {plural}: {', '.join(names)}")
    return name


def _setting(text: str, policy_flag: str | None) -> tuple[str, str | None]:
    """The mode and the policy to publish (None: the engine keeps its policy)."""
    if not text.strip():
        # An empty setting reads as "off" elsewhere (an unset variable); published to a running
        # engine from a script whose variable came out empty it would switch remediation off unasked.
        raise ValueError("give a mode: MODE[:POLICY] (modes: " + ", ".join(MODES) + ")")
    bare = text.strip().lower()
    if ":" not in bare and bare not in POLICIES:
        mode, policy = _name(text, MODES, "mode", "modes"), None  # a bare mode keeps the engine's policy
    else:
        setting = parse_remediation_setting(text)
        mode, policy = setting.mode, setting.policy
    if policy_flag is None:
        return mode, policy
    flag = _name(policy_flag, list(POLICIES), "policy", "policies")
    if policy is not None and flag != policy:
        raise ValueError(f"{text!r} names policy {policy} and --policy names {flag}: give one")
    return mode, flag


def run(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) not in ("set", "status"):
        raise ValueError("give an action: kvscope remediation set|status --channel PATH (see --help)")
    if os.path.isdir(args.channel):
        # Refused by the user's path before anything is read or written: publishing would fail on
        # the rename naming a temp file, and status would read the folder as an empty control file.
        raise ValueError(f"--channel {args.channel}: is a directory, not a control file "
                         "(give the file the engine's KVSCOPE_REMEDIATION_CHANNEL names)")
    channel = FileControlChannel(args.channel)
    if args.action == "status":
        return _status(channel, as_json=args.json)
    mode, policy = _setting(args.mode, args.policy)
    if args.at_iteration < -1:
        raise ValueError(f"--at-iteration must be >= 0 (or -1: the next pass), got {args.at_iteration}")
    folder = os.path.dirname(os.path.abspath(args.channel))
    if not os.path.isdir(folder):
        raise ValueError(f"{args.channel}: no such directory {folder}")
    record = ControlRecord(channel.next_seq(), mode, policy, args.at_iteration)
    channel.publish(record)
    if args.json:
        sys.stdout.write(json.dumps(asdict(record), sort_keys=True) + "\n")
    else:
        when = f"at iteration {record.at_iteration}" if record.at_iteration >= 0 else "at its next scheduling pass"
        print(f"published seq={record.seq} mode={mode}" + (f" policy={policy}" if policy else "")
              + f" to {args.channel}; every rank reading it applies it {when}")
    return 0


def _status(channel: FileControlChannel, *, as_json: bool) -> int:
    if not channel.path.exists():
        raise ValueError(f"{channel.path}: no such control file (nothing published yet)")
    channel.settle_s = 0.0  # read by a person, not raced by an engine pass: a broken file is broken now
    try:
        record = channel.poll()
    except ControlRecordError as e:
        raise ValueError(f"{channel.path}: engines refuse this record: {e.detail}") from None
    if record is None:  # an empty file
        raise ValueError(f"{channel.path}: empty control file (nothing published yet)")
    problem = check_record(record)
    if problem is not None:
        raise ValueError(f"{channel.path}: engines refuse this record (seq={record.seq}): {problem[1]}")
    if as_json:
        sys.stdout.write(json.dumps(asdict(record), sort_keys=True) + "\n")
    else:
        when = f"at iteration {record.at_iteration}" if record.at_iteration >= 0 else "at each rank's next pass"
        print(f"{channel.path}: seq={record.seq} mode={record.mode.partition('+triggered:')[0]} "
              f"policy={record.policy or '(unchanged)'} {when}")
    return 0
