"""``autoconfig validate``: check the step-time and memory models against published runs."""

from pathlib import Path

import click

from autoconfig.errors import InputError


@click.command()
@click.option("--runs", "runs_path", type=click.Path(path_type=Path), default=None,
              help="CSV of published runs (default: the shipped benchmarks/published_runs.csv).")
@click.option("--summary", is_flag=True, help="Print only the MAPE, rank and memory summaries.")
def validate(runs_path: Path | None, summary: bool) -> None:
    """Predict every usable published run and print the errors (MAPE per source and
    overall), the rank correlation within groups, and memory errors where measured."""
    from autoconfig.validation.scoring import default_runs_path, format_report, validate as run_validation

    path = runs_path or default_runs_path()
    if not path.is_file():
        raise InputError(f"runs file {str(path)!r} not found: give --runs a CSV of published runs")
    click.echo(format_report(run_validation(path), show_rows=not summary))
