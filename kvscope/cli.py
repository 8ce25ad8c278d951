"""``kvscope`` command line: a thin dispatcher over ``kvscope.commands.<name>`` modules.

Each command module exposes ``register(subparsers)`` (adds its parser and sets ``func``) and
``run(args) -> int``. Only the module of the command that runs is imported (the others are listed
with their one-line help from :data:`COMMANDS`), so ``kvscope --version`` and ``kvscope --help``
start without pandas, and a command whose optional dependencies are missing says why when it is run,
without breaking the others.
Contract: ``--json`` prints exactly one JSON object on stdout; errors exit non-zero with one line.
Exit codes: 2 bad input, configuration or output path (one line naming the file, row and field or
flag); 1 a command's own "partial" result (documented per command); 70 an internal error (one line;
``KVSCOPE_DEBUG=1`` shows the traceback); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM, ended in
the same order as a Ctrl-C: an event file being written gets its ``interrupted`` end record); 141
stdout closed early (``| head``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from kvscope.arguments import OneLineParser

COMMANDS: dict[str, str] = {
    "demo": "reproduce the draft-pool crash on the engine model and analyze it",
    "replay": "replay a scenario or trace on the CPU engine model",
    "analyze": "find admission gaps, exhaustion, stalls and never-fitting requests in event files",
    "export": "replay recorded event files into OpenTelemetry (OTLP) with their original timestamps",
    "remediation": "switch remediation of a running engine through its control file",
    "check": "check the seam record against installed engines and the model",
    "selfcheck": "check that recording and replay files work here",
}
"""Command modules under ``kvscope.commands``, in help order, with the line ``kvscope --help`` shows
for each: the module's own ``help=`` (kept equal by tests/unit/cli/test_cli_startup.py), here so that
listing the commands imports none of them."""


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: the command it names is registered by its module, every other one
    is listed by name and help line only (``argv`` None: all of them, e.g. for documentation)."""
    parser = OneLineParser(
        prog="kvscope",
        description="Observe and remediate the KV cache of LLM inference engines.",
    )
    from kvscope import __version__

    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _command_named(argv) if argv is not None else None
    for name, summary in COMMANDS.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=summary)
            continue
        try:
            mod = importlib.import_module(f"kvscope.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("kvscope.commands"):
                continue  # not written yet
            p = sub.add_parser(name, help=f"(unavailable: {e})")
            p.set_defaults(func=_unavailable(name, str(e)))
            continue
        mod.register(sub)
    return parser


def _command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs: its first word (the options before it take no value)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def _unavailable(name: str, why: str):
    def run(_args: argparse.Namespace) -> int:
        raise CliError(f"kvscope {name} is unavailable here: {why}")

    return run


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    # Here, not at the top: --version and --help stay without the recording package.
    from kvscope.recording.interrupts import Terminated, interrupts_recorded

    try:
        with interrupts_recorded():  # SIGTERM unwinds as Terminated: the command ends in order
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except CliError as e:
        return _one_line(args.command, str(e), 2)
    except BrokenPipeError:
        # The reader went away (``| head -1``): nothing more to say to anyone.
        _silence_stdout()
        return 141
    except (FileNotFoundError, ValueError) as e:
        return _one_line(args.command, str(e), 2)
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return _one_line(args.command, f"{where}{e.strerror or e}", 2)
    except Terminated as e:
        print(f"kvscope {args.command}: interrupted ({signal.Signals(e.signum).name})", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print(f"kvscope {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the contract is one line, never a traceback
        if os.environ.get("KVSCOPE_DEBUG") == "1":
            raise
        return _one_line(args.command, f"internal error: {type(e).__name__}: {e} "
                                       "(KVSCOPE_DEBUG=1 shows the traceback)", 70)


def _one_line(command: str, message: str, code: int) -> int:
    text = " ".join(message.split())
    try:
        print(f"kvscope {command}: error: {text}", file=sys.stderr)
    except (BrokenPipeError, OSError):
        pass
    return code


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
