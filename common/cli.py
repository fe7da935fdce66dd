"""Shared command-line plumbing: one exception type for bad user input, one way to word it, one way to report it."""

import argparse
import contextlib
import errno
import math
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path


class UserError(ValueError):
    """A problem with the user's input: reported as one line, exit status 2, no traceback."""


def first_line(err: BaseException) -> str:
    """An exception's message cut to its first line (libraries raise pages), or its type's name if it has none."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def cannot_write(what: str, err: BaseException, remedy: str, free_in: Path | None = None) -> UserError:
    """A failed write as one user line: `cannot write <what> (<why>); <remedy>`. The reason is the OS's words
    for an OSError (e.g. "No space left on device"); free_in adds how much space is left in that folder."""
    reason = err.strerror if isinstance(err, OSError) and err.strerror else first_line(err)
    if free_in is not None:
        with contextlib.suppress(OSError):
            reason += f"; {shutil.disk_usage(free_in).free / 2**20:,.0f} MiB free there"
    return UserError(f"cannot write {what} ({reason}); {remedy}")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """argparse's own: each flag's default after its help, the description's line breaks kept."""


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def finite_float(text: str) -> float:
    """argparse type: a float that is neither inf nor nan (nan passes every comparison's check unnoticed)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def non_negative(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = finite_float(text)
    if value < 0:
        raise ValueError(text)
    return value


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (a bad flag is a UserError, not usage text) and HelpFormatter by default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # --norm must never silently mean --norm_position
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message} (see --help)")


def require_positive(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Each named flag, when set, must be a positive integer."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name} must be a positive integer, got {value}")


def require_writable_dir(flag: str, path: Path) -> None:
    """Refuse now, before any work, a directory a script will create or write into but cannot: the nearest part
    of the path that exists must be a directory this process may write in."""
    path = Path(path)
    parent = next(p for p in (path, *path.parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path} is not writable ({parent} is not a writable directory)")


# A write the OS refused: a read-only or unwritable folder, a full disk or quota.
CANNOT_WRITE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def run_cli(main: Callable[[], object]) -> None:
    """Run a script's main(); a UserError, or a write the OS refused, ends in `error: <one line>` and exit 2."""
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:
        if err.errno not in CANNOT_WRITE:
            raise
        print(f"error: cannot write {err.filename or 'a file'} ({err.strerror})", file=sys.stderr)
        sys.exit(2)
