"""Crash-safe writes: a file or directory becomes visible under its final name only once it is complete."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(dst: Path) -> Iterator[Path]:
    """Yield a hidden sibling of `dst` to write into; rename it to `dst` when the block ends without error.

    `dst` must not exist. On error (or Ctrl-C) the partial directory is removed, so a reader sees either
    nothing or the whole thing, never half of it.
    """
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
