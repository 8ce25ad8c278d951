"""``kvscope`` command line: a thin dispatcher over ``kvscope.commands.<name>`` modules.

Each command module exposes ``register(subparsers)`` (adds its parser and sets ``func``) and
``run(args) -> int``. Modules are imported when the CLI starts, one by one, so a command whose
optional dependencies are missing is listed with the reason instead of breaking the others.
Contract: ``--json`` prints exactly one JSON object on stdout; errors exit non-zero with one line.
Exit codes: 2 bad input, configuration or output path (one line naming the file, row and field or
flag); 1 a command's own "partial" result (documented per command); 70 an internal error (one line;
``KVSCOPE_DEBUG=1`` shows the traceback); 130 interrupted; 141 stdout closed early (``| head``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from kvscope.arguments import OneLineParser

COMMANDS: tuple[str, ...] = ("demo", "replay", "analyze", "export", "remediation", "check", "selfcheck")
"""Command modules under ``kvscope.commands``, in help order."""


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kvscope",
        description="Observe and remediate the KV cache of LLM inference engines.",
    )
    from kvscope import __version__

    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
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


def _unavailable(name: str, why: str):
    def run(_args: argparse.Namespace) -> int:
        raise CliError(f"kvscope {name} is unavailable here: {why}")

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
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
