"""``autoconfig sweep`` and ``autoconfig compare``: run a matrix of settings into
one run directory, and compare two such runs (thin: parse, one library call,
render)."""

import sys
import time
from pathlib import Path

import click

from autoconfig.cli.options import OUTPUT_DIR

EXIT_REGRESSION = 1
EXIT_ALL_FAILED = 1


@click.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("-o", "--output-dir", type=OUTPUT_DIR,
              help="Run directory (default ./autoconfig-out/sweeps/<UTC timestamp>). Running "
                   "again into the same directory resumes it.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False),
              help="Run directory of an interrupted sweep: skip settings with a final result.")
@click.option("--retry", multiple=True, type=click.Choice(("failed", "profile_failed", "error")),
              help="Run again settings whose record has this status (repeatable; failed: "
                   "profile_failed and error); a profiled one also re-runs its failed plans.")
@click.option("--calibration", type=click.Path(dir_okay=False),
              help="Calibration file from `autoconfig calibrate`: used for the settings on the "
                   "GPU it was fitted on (their records say so), shipped constants elsewhere.")
@click.option("--no-plots", is_flag=True, help="Do not write PNG plots (matplotlib not loaded).")
def sweep(sweep_file, output_dir, resume_dir, retry, calibration, no_plots) -> None:
    """Run every setting of SWEEP_FILE (models x GPUs x nodes x batch x sequence x
    precision x stack x objective; predict-only or profiled) and write
    manifest.json, settings/*.json (one per setting, as it finishes), sweep.csv,
    sweep.md, sweep.json and plots. A failing setting is recorded with its
    reason; exit status 1 only when every setting failed."""
    from autoconfig.errors import InputError
    from autoconfig.progress import Progress
    from autoconfig.sweep.run import run_sweep
    from autoconfig.sweep.spec import load_sweep
    from autoconfig.sweep.summary import write_summary

    spec = load_sweep(Path(sweep_file))
    if resume_dir and output_dir and Path(resume_dir) != Path(output_dir):
        raise InputError("give either --resume DIR or -o DIR (or both the same)")
    if resume_dir and not (Path(resume_dir) / "manifest.json").is_file():
        raise InputError(f"invalid --resume {resume_dir}: no manifest.json there (give the "
                         "run directory of an earlier sweep)")
    out = Path(resume_dir or output_dir or Path("autoconfig-out") / "sweeps" /
               time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    started = time.monotonic()
    with Progress(len(spec.settings), f"sweep {spec.name}") as bar:
        if calibration:
            from autoconfig.profiling.calibrate import constants_for, read_calibration
            # a file that cannot apply is one line before anything runs
            constants_for(calibration, read_calibration(calibration).gpu)
        records = run_sweep(spec, out, Path(sweep_file), progress=bar, retry=retry,
                            calibration=calibration, plots=not no_plots)
    files = write_summary(out, records, spec.name, spec.tokens, plots=not no_plots)
    ok = sum(r["status"] == "ok" for r in records)
    click.echo(files["markdown"].read_text())
    click.echo(f"{ok}/{len(records)} settings ok in {time.monotonic() - started:.1f} s; "
               f"run directory {out}")
    click.echo("wrote:\n" + "\n".join(f"  {p}" for p in files.values()))
    if ok == 0:
        click.echo("error: every setting failed (reasons in sweep.md; after fixing the cause, "
                   "run again with --retry failed)", err=True)
        sys.exit(EXIT_ALL_FAILED)


@click.command()
@click.argument("old", type=click.Path(file_okay=False))
@click.argument("new", type=click.Path(file_okay=False))
@click.option("--threshold", type=float, default=5.0, show_default=True,
              help="Percent drop in tokens/s/GPU that counts as a regression.")
@click.option("--either-way", is_flag=True,
              help="Also fail on a rise beyond the threshold (pin predictions to a baseline).")
@click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False),
              help="Also write the summary here (e.g. $GITHUB_STEP_SUMMARY).")
def compare(old, new, threshold, either_way, markdown_file) -> None:
    """Compare two sweep run directories setting by setting: change in predicted
    and measured throughput, best-plan changes, settings that became infeasible
    or are in only one run. Exit status 1 when anything regressed beyond the
    threshold."""
    from autoconfig.atomic import write_atomic
    from autoconfig.cli import environment_fault, file_option_advice
    from autoconfig.errors import InputError
    from autoconfig.sweep.compare import compare_runs, load_run, render_markdown

    result = compare_runs(load_run(Path(old)), load_run(Path(new)), threshold, either_way)
    text = render_markdown(result, old, new)
    if markdown_file:
        path = Path(markdown_file)
        try:
            previous = path.read_text() if path.is_file() else ""
            write_atomic(path, previous + text)
        except OSError as exc:
            # the default advice names -o, which compare does not have
            raise InputError(environment_fault(exc, file_option_advice("--markdown"))) from exc
    click.echo(text)
    if result.regressions:
        sys.exit(EXIT_REGRESSION)
