"""Command-line plumbing every script shares: one exception for bad input,
argparse types that check values, one way to report a problem in one line."""

import argparse
import errno
import math
import os
import sys
from collections.abc import Callable


class UserError(ValueError):
    """A problem with the user's input:
    reported as one line, exit status 2, no traceback."""


def first_line(err: BaseException) -> str:
    """An exception's message cut to its first line
    (libraries raise pages), or its type's name."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                    argparse.RawDescriptionHelpFormatter):
    """argparse's own: each flag's default after its help
    (unless the help states it: one per device, say),
    the description's line breaks kept."""

    def _get_help_string(self, action):
        if "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


# argparse types: a value they refuse is argparse's one line,
# "invalid positive_int value: '0'".
def user_path(text: str) -> str:
    """A path with ~ expanded: the shell leaves --out_dir=~/run as typed,
    and a folder named ~ in the working directory is a trap."""
    return os.path.expanduser(text)


def positive_int(text: str) -> int:
    if (value := int(text)) < 1:
        raise ValueError(text)
    return value


def finite_float(text: str) -> float:
    # nan passes every comparison's check unnoticed
    if not math.isfinite(value := float(text)):
        raise ValueError(text)
    return value


def count(text: str) -> int:
    """An integer >= 0: a seed, a number of steps or tokens."""
    if (value := int(text)) < 0:
        raise ValueError(text)
    return value


def non_negative(text: str) -> float:
    if (value := finite_float(text)) < 0:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    if (value := non_negative(text)) == 0:
        raise ValueError(text)
    return value


def probability(text: str) -> float:
    """A share in (0, 1]: top-p sampling's nucleus."""
    if (value := positive_float(text)) > 1:
        raise ValueError(text)
    return value


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (a UserError, not usage text) and HelpFormatter."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        # --norm must never silently mean --norm_position
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message} (see --help)")

    def parse_known_args(self, args=None, namespace=None):
        # argparse keeps only the last list of a list flag given twice:
        # --seeds 0 --seeds 1 would be seed 1 alone
        words = [str(w).split("=")[0] for w in (sys.argv[1:] if args is None else args)]
        lists = {flag for action in self._actions if action.nargs in ("+", "*")
                 for flag in action.option_strings}
        if twice := [flag for flag in lists if words.count(flag) > 1]:
            self.error(f"argument {twice[0]}: given twice; list all its values after one {twice[0]}")
        return super().parse_known_args(args, namespace)


# A write the OS refused: a read-only or unwritable folder, a full disk or quota,
# a file where a folder goes.
CANNOT_WRITE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                errno.ENOTDIR, errno.EEXIST)


def run_cli(main: Callable[[], object]) -> None:
    """Run main();
    a UserError or a write the OS refused ends in `error: <one line>`, exit 2."""
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:
        if err.errno not in CANNOT_WRITE:
            raise
        print(f"error: cannot write {err.filename or 'a file'} ({err.strerror})",
              file=sys.stderr)
        sys.exit(2)
