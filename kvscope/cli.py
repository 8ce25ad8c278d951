"""``kvscope`` command line: a thin dispatcher over ``kvscope.commands.<name>`` modules.

Each command module exposes ``register(subparsers)`` (adds its parser and sets ``func``) and
``run(args) -> int``. Modules are imported when the CLI starts, one by one, so a command whose
optional dependencies are missing is listed with the reason instead of breaking the others.
Contract: ``--json`` prints exactly one JSON object on stdout; errors exit non-zero with one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: tuple[str, ...] = ("demo", "replay", "analyze", "export", "check", "selfcheck")
"""Command modules under ``kvscope.commands``, in help order."""


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvscope",
        description="Observe and remediate the KV cache of LLM inference engines.",
    )
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
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"kvscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"kvscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kvscope {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
