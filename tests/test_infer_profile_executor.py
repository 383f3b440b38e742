"""infer --profile refuses the replay executor before searching or writing."""

from pathlib import Path

from cli_runner import run_cli


def test_replay_executor_is_refused_up_front(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["infer", "--model", "tiny", "--gpu", "h100", "--gpus", "8",
                            "--input-len", "10", "--output-len", "10", "--no-plots",
                            "-o", str(out), "--profile", "--executor", "replay"], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "invalid --executor replay for infer --profile" in lines[0]
    assert "--measurements FILE.csv" not in err   # an option infer does not have
    assert not out.exists()
