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


FP8_8B = ["estimate", "--model", "llama3", "--size", "8b", "--gpu", "b200", "--gpus", "8",
          "--gbs", "128", "--seq-len", "8192", "--tp", "1", "--pp", "1", "--mbs", "1",
          "--format", "json"]


def test_estimate_takes_the_fp8_recipe_and_says_which_ran():
    import json
    runner = CliRunner()

    def rate(*extra):
        result = runner.invoke(cli, [*FP8_8B, "--precision", "fp8", *extra])
        assert result.exit_code == 0, result.output
        data = json.loads(result.output)
        return data["fp8_recipe"], data["tokens_per_s_per_gpu"]
    assert rate()[0] == "mxfp8"                       # Blackwell's default
    delayed, current = rate("--fp8-recipe", "delayed"), rate("--fp8-recipe", "current")
    assert delayed[0] == "delayed" and current[0] == "tensorwise"
    assert delayed[1] > current[1]                    # current scaling's amax pass costs
    for extra, message in ((["--precision", "bf16", "--fp8-recipe", "delayed"],
                            "--fp8-recipe delayed needs --precision fp8"),
                           (["--precision", "fp8", "--fp8-recipe", "e5m2"],
                            "invalid --fp8-recipe 'e5m2': allowed are delayed, tensorwise")):
        from autoconfig.errors import InputError
        result = runner.invoke(cli, [*FP8_8B, *extra])
        assert result.exit_code != 0 and isinstance(result.exception, InputError)
        assert message in str(result.exception)       # main() prints it as one line


def test_estimate_takes_the_cross_entropy_and_prices_its_traffic():
    """--cross-entropy overrides the stack's loss: Llama 3 8B's 128K vocabulary at TP 1
    makes the unfused loss measurably slower than Transformer Engine's; the JSON says
    which ran; a bad name is a one-line usage error."""
    import json
    runner = CliRunner()

    def run(*extra):
        result = runner.invoke(cli, [*FP8_8B, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)
    default, te = run(), run("--cross-entropy", "te")
    assert default["software"]["cross_entropy"] == "unfused"      # megatron-lm's default
    assert te["software"]["cross_entropy"] == "te"
    assert run("--stack", "nemo")["software"]["cross_entropy"] == "te"
    assert 1.01 < te["tokens_per_s_per_gpu"] / default["tokens_per_s_per_gpu"] < 1.2
    bad = runner.invoke(cli, [*FP8_8B, "--cross-entropy", "liger"])
    assert bad.exit_code == 2 and "liger" in bad.output
