"""Crash-safe writes and an exclusive lock: a file or directory becomes visible under its final name only once it
is complete, and whatever a crash leaves behind has a recognizable hidden name (see remove_leftovers)."""

import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(dst: Path) -> Iterator[Path]:
    """Yield a hidden sibling of `dst` (which must not exist) to write into, renamed to `dst` when the block ends
    without error and removed otherwise: a reader sees nothing or the whole thing, never half of it."""
    dst = Path(dst)
    tmp = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        os.rename(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def point_symlink(link: Path, target_name: str) -> None:
    """Atomically make `link` point at `target_name` (a sibling), replacing any previous link."""
    tmp = link.with_name(f".{link.name}.link-{os.getpid()}")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target_name, tmp)
    os.replace(tmp, link)


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A fresh temporary sibling of path (a file or folder) to write into; when the block ends it replaces path,
    or, if the block raised, it is removed. path, even a symlink planted there, is replaced, never written
    through, and a reader sees the old version or the whole new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    remove(tmp)
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # os.replace renames a folder only onto an empty one
        os.replace(tmp, path)
    finally:
        remove(tmp)


def remove(path: Path) -> None:
    """Delete a file, link or folder tree, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_atomically(path: Path, data: str | bytes) -> None:
    with replaced(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def write_file_atomically(path: Path, write):
    """Call write(binary_file) on a temporary file beside path, then rename it into place; return what write
    returned. Readers never see half a file, and an interrupted write leaves only the old one."""
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=Path(path).name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            result = write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes the file private; these are plain, shareable files
        os.replace(tmp, path)
        return result
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_leftovers(directory: Path) -> list[str]:
    """Delete what the writers above leave when their process is killed outright (no cleanup runs then), and
    return the names. Only for a directory no other process is writing to, e.g. one held with exclusive_lock."""
    directory = Path(directory)
    found = [*directory.glob(".*.partial-*"), *directory.glob(".*.link-*"), *directory.glob("*.tmp")]
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return sorted(p.name for p in found)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        digest = hashlib.sha256()
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


class LockHeld(Exception):
    """Another process holds the lock; its text is what the holder wrote into the lock file (its pid)."""


@contextmanager
def exclusive_lock(path: Path) -> Iterator[bool]:
    """Hold an exclusive flock on `path` (created if missing) for the block; raise LockHeld at once if another
    process holds it. The kernel drops the lock when its holder exits in any way, so it is never stale after a
    crash. Yields False, without locking, on a filesystem that has no locks (some network filesystems)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise LockHeld(os.pread(fd, 64, 0).decode(errors="replace").strip()) from None
            locked = False
        else:
            locked = True
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield locked
    finally:
        os.close(fd)
