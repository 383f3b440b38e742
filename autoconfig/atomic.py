"""Atomic file writes: a temporary file in the same folder, flushed to disk,
then ``os.replace``, so a reader or an interrupted run never sees half a file."""

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (creating the folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
