"""The one way the project writes a file or folder:
into a temporary sibling that then replaces it,
so a reader sees the old version or the whole new one, never half of it,
and a link planted at the path is never written through.
And a full disk met while writing, as one line."""

import errno
import fcntl
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.cli import UserError


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A fresh temporary sibling of path (for a file or a folder) to write into;
    when the block ends it replaces path, or, if the block raised, it is removed.
    A file never replaces a folder: a mistyped --out would delete what it holds."""
    path = Path(path)
    tmp = temporary(path)
    remove(tmp)
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            if not tmp.is_dir():
                raise UserError(f"{path} is a folder: give a file's path")
            shutil.rmtree(path)  # os.replace renames a folder only onto an empty one
        os.replace(tmp, path)
    finally:
        remove(tmp)


def temporary(path: Path) -> Path:
    """The hidden sibling that stands in for path while it is written or deleted."""
    return path.with_name(f".{path.name}.tmp")


def remove(path: Path) -> None:
    """Delete a file, link or folder tree, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_atomically(path: Path, data: str | bytes) -> None:
    with replaced(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


@contextmanager
def taking_turns(lock: Path, waiting: str) -> Iterator[None]:
    """Hold an flock on the file lock: a second process writing the same target
    (replaced() gives each target one temporary name)
    waits for the first, saying `waiting`."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(waiting, file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (which releases the lock)


def out_of_space(err: BaseException, folder: Path) -> bool:
    """A write refused for want of space: the OS says so,
    in err or what it was raised from (datasets wraps it), by its errno or in its words
    (safetensors: 'No space left on device (os error 28)');
    or a library lost both (torch.save: 'unexpected pos', numpy: 'requested and written')
    on a disk with under 1 MiB free."""
    cause = err
    while cause is not None:
        if getattr(cause, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            return True
        if os.strerror(errno.ENOSPC) in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    folder = Path(folder)
    while not folder.exists():  # (a cache not made yet: its disk)
        folder = folder.parent
    return shutil.disk_usage(folder).free < 2**20


@contextmanager
def space_needed(folder: Path, then: str) -> Iterator[None]:
    """A write in the block that fails for want of space in folder ends in one line:
    `out of disk space in <folder>: <then>`."""
    try:
        yield
    except Exception as err:
        if isinstance(err, UserError) or not out_of_space(err, folder):
            raise
        raise UserError(f"out of disk space in {folder}: {then}") from None
