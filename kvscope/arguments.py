"""The command lines' argument parser: argparse with one-line errors (standard library only, so that
every entry point can use it, the ``kvscope`` CLI and the ``kvscope-instrument`` launcher alike)."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse with the contract's one-line errors. Stock argparse prints the whole usage first:
    nine lines for ``replay`` before the line that says what was wrong. Subcommand parsers are of
    this class too (``add_subparsers`` uses the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
