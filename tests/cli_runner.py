"""Running autoconfig from tests: in-process through the real entry point, or as
a subprocess exactly as a user types it."""

import subprocess
import sys

import pytest

from autoconfig.cli import main


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``autoconfig ARGS`` in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def cli(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """``python -m autoconfig ARGS`` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "autoconfig", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)
