"""The one way the project writes a file or folder: into a temporary sibling that then replaces it,
so a reader sees the old version or the whole new one, never half of it, and a link planted at the
path is never written through."""

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A fresh temporary sibling of path (for a file or a folder) to write into; when the block ends
    it replaces path, or, if the block raised, it is removed."""
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
