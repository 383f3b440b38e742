"""The command line as a whole: every command has help, and the CLI starts light."""

import subprocess
import sys

import pytest
from click.testing import CliRunner

from autoconfig.cli import cli

COMMANDS = sorted(cli.commands)


def test_the_commands_of_the_readme_are_registered():
    assert {"base", "capacity", "catalog", "estimate", "report", "search", "validate"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and len(cli.commands[name].help or "") > 20


def test_cli_does_not_import_torch_or_megatron():
    """The search path must install and start light: only the profiling worker imports them."""
    code = ("import sys, autoconfig.cli, autoconfig.training.search, autoconfig.training.capacity, "
            "autoconfig.profiling.sweep; "
            "print(any(m == 'torch' or m.startswith('megatron') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_unknown_command_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "serach"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
