"""Report files written whole or not at all: a temporary file beside the target, renamed over it
(a full disk or a kill leaves the old report, never a truncated one)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A fresh path in `path`'s folder (same suffix) to write; renamed to `path` on success,
    removed on any failure."""
    target = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
    os.close(fd)
    try:
        # mkstemp makes it 0600: give it the mode the old report had, or the umask's default
        os.chmod(temp, target.stat().st_mode & 0o7777 if target.is_file() else 0o666 & ~_umask())
        yield Path(temp)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    with replacing(path) as temp:
        temp.write_text(text, encoding="utf-8")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
