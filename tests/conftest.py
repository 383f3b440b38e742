"""Fixtures shared by test modules: the local SLURM the SLURM tests talk to."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm-localhost.sh"
SLURM_DIR = os.environ.get("AUTOCONFIG_SLURM_DIR", "/tmp/autoconfig-slurm")


def _cannot_start(reason: str) -> None:
    """Skip on a developer machine; in CI (CI=true) a SLURM that will not start is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"cannot start a local SLURM in CI: {reason}")
    pytest.skip(f"cannot start a local SLURM: {reason}")


@pytest.fixture(scope="session")
def slurm():
    env = dict(os.environ, AUTOCONFIG_SLURM_DIR=SLURM_DIR)
    was_up = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True,
                            env=env).returncode == 0
    try:
        proc = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True,
                              timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _cannot_start(str(exc))
    if proc.returncode != 0:
        _cannot_start(str(proc.stderr.strip().splitlines()[-1:]))
    os.environ["SLURM_CONF"] = f"{SLURM_DIR}/etc/slurm.conf"
    yield SLURM_DIR
    if not was_up:  # leave the machine as we found it
        subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, env=env, timeout=120)
