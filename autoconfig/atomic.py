"""Atomic file writes: a temporary file in the same folder, flushed to disk,
then ``os.replace``, so a reader or an interrupted run never sees half a file.

The file gets the mode an ordinary ``open`` would give under the user's umask
(``mkstemp`` creates 0600), plus the execute bits for scripts."""

import errno
import os
import tempfile
from pathlib import Path

SCRIPT_SUFFIXES = (".sh", ".sbatch")
"""Files written with the execute bits (per umask): scripts meant to be run."""


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_target(path: Path) -> Path:
    """The file a write to ``path`` must replace: a symbolic link's target (the
    rename would otherwise replace the link and leave its target stale); an
    existing path that is not a regular file (a device, a pipe, a folder) is an
    OSError naming it, since renaming over it would not write through it."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    if target.exists() and not target.is_file():
        raise OSError(errno.EEXIST, "exists and is not a regular file", str(path))
    return target


def make_parent(path: Path) -> None:
    """Create ``path``'s folder; a part of it that is a file is ENOTDIR naming
    ``path`` (mkdir says only "File exists")."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(path)) from None


def write_atomic(path: Path, text: str, executable: bool | None = None) -> Path:
    """Write ``text`` to ``path`` atomically (creating the folder; through a
    symbolic link to its target). The mode is 0666 & ~umask, or 0777 & ~umask
    when ``executable`` (default: a ``.sh``/``.sbatch`` name)."""
    path = write_target(path)
    make_parent(path)
    if executable is None:
        executable = path.suffix in SCRIPT_SUFFIXES
    mode = (0o777 if executable else 0o666) & ~current_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:   # a full or read-only folder: name the file meant
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "w", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if exc.filename is None:   # a failed write names no file: name the one meant
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
