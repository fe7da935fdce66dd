"""Shared command-line plumbing: one exception type for bad user input, one way to report it."""

import argparse
import sys
from collections.abc import Callable


class UserError(ValueError):
    """A problem with the user's input: reported as one line, exit status 2, no traceback."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a UserError (one line) instead of usage text plus a message."""

    def error(self, message: str):
        raise UserError(f"{message} (see --help)")


def run_cli(main: Callable[[], object]) -> None:
    """Run a script's main(); turn a UserError into `error: <message>` on stderr and exit 2."""
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
