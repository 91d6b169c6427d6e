"""The subcommands' argument parser: argparse, but a bad argument is one line on stderr.

argparse prints its whole usage block before the error, several lines that bury the one that
says what was wrong; every other bad input of the `slipstream` command is one line naming the
flag or setting (`slipstream CMD -h` still prints the usage). The exit status stays argparse's
2 for a usage error. Every error of a subcommand begins as argparse begins this one,
`slipstream CMD: error: ` (`cli.main` prints the config errors it catches so).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose `error` prints `PROG: error: MESSAGE` alone and exits 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)
