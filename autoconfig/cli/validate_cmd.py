"""``autoconfig validate``: check the step-time and memory models against published runs."""

import sys
from pathlib import Path

import click

from autoconfig.errors import InputError


@click.command()
@click.option("--runs", "runs_path", type=click.Path(path_type=Path), default=None,
              help="CSV of published runs (default: the shipped benchmarks/published_runs.csv).")
@click.option("--summary", is_flag=True, help="Print only the MAPE, rank and memory summaries.")
@click.option("--cross-validate", is_flag=True,
              help="Recompute the leave-one-source-out figures (a refit per source, minutes) "
                   "and store them in benchmarks/cross_validation.json.")
@click.option("--check", is_flag=True,
              help="Exit 1 when a target is missed (for CI).")
def validate(runs_path: Path | None, summary: bool, cross_validate: bool, check: bool) -> None:
    """Predict every usable published run and print the errors (MAPE per source and
    overall), the rank correlation within groups, memory errors where measured, the
    leave-one-source-out figures and which targets are met."""
    from autoconfig.validation import crossval_store
    from autoconfig.validation.scoring import (default_runs_path, format_cross_validation,
                                               format_families, format_report,
                                               format_targets, targets,
                                               validate as run_validation)

    path = runs_path or default_runs_path()
    if not path.is_file():
        raise InputError(f"runs file {str(path)!r} not found: give --runs a CSV of published runs")
    report = run_validation(path)
    if cross_validate:
        _cross_validate(report, path)
    stored, why = crossval_store.load_current() if path == default_runs_path() else (
        None, "computed for the shipped runs only")
    click.echo(format_report(report, show_rows=not summary))
    click.echo("\n".join(format_cross_validation(stored, why)))
    click.echo("\n".join(["", *format_families(report, stored)]))
    rows = targets(report, stored)
    click.echo("\n".join(["", *format_targets(rows)]))
    if check and not all(met for *_, met in rows):
        click.echo("error: validation targets missed (see Targets above)", err=True)
        sys.exit(1)


def _cross_validate(report, path: Path) -> None:
    import time

    from autoconfig.training.step_time import load_constants
    from autoconfig.validation import crossval_store
    from autoconfig.validation.calibration import cross_validate
    from autoconfig.validation.scoring import held_out_groups, weighted_spearman

    start = time.time()
    runs = [r.run for r in report.rows]
    cv = cross_validate(runs, load_constants())
    rho = weighted_spearman(held_out_groups(report, cv.held_out_predictions))
    where = crossval_store.save(cv, rho, time.time() - start)
    click.echo(f"cross-validated in {time.time() - start:.0f} s: wrote {where}", err=True)
