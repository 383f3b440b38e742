"""Reading a text file a user names (a model or GPU YAML, a sweep file, a runs
CSV): only regular files, bounded in size, UTF-8 — anything else is a one-line
error naming the file, never a hang (a FIFO or /dev/zero) or a traceback."""

import os
import stat
from pathlib import Path

from autoconfig.errors import InputError

MAX_INPUT_BYTES = 64 * 2**20
"""Largest input file read (64 MiB): the biggest shipped input, the published
runs CSV, is under 1 MiB; a larger one is a wrong path."""


def read_text(path, what: str = "file") -> str:
    """The file's text. InputError (one line) for a missing or unreadable path,
    a directory, device or FIFO, a file over ``MAX_INPUT_BYTES``, or bytes that
    are not UTF-8."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise InputError(f"invalid {what} {str(path)!r}: {kind} (give a text file)")
        if info.st_size > MAX_INPUT_BYTES:
            raise InputError(f"invalid {what} {str(path)!r}: {info.st_size} bytes, more than "
                             f"the {MAX_INPUT_BYTES // 2**20} MiB an input file may have")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid {what} {str(path)!r}: not UTF-8 text (byte "
                         f"0x{data[exc.start]:02x} at offset {exc.start})") from None
