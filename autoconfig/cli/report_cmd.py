"""``autoconfig report DIR``: rebuild the profiling report from a results directory."""

from pathlib import Path

import click

from autoconfig.errors import InputError
from autoconfig.profiling import store
from autoconfig.profiling.rank import OBJECTIVES


@click.command()
@click.argument("results_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--objective", type=click.Choice(OBJECTIVES), default=None,
              help="Rank by measured tokens/s (throughput) or step time (latency); "
                   "default: the one the run used.")
def report(results_dir: str, objective: str | None) -> None:
    """Rebuild profile_report.csv and profile_report.md from the results
    directory of a `--profile` run (plans.csv + results.jsonl), and print it."""
    from autoconfig.profiling.report import write_report

    path = Path(results_dir)
    if not _is_store(path) and _is_store(path / store.PROFILE_SUBDIR):
        path = path / store.PROFILE_SUBDIR   # the search output folder holding profile/
    if not path.is_dir():
        raise InputError(f"invalid results directory {results_dir!r}: it does not exist")
    if not _is_store(path):
        raise InputError(f"invalid results directory {results_dir!r}: expected the folder a "
                         f"--profile run wrote ({store.RESULTS_FILE}, or {store.PLANS_FILE} with "
                         f"{store.META_FILE}), e.g. OUT/{store.PROFILE_SUBDIR}")
    warning = store.check_store(path)
    if warning:
        click.echo(warning, err=True)
    csv_path, md_path, _ = write_report(path, objective)
    click.echo(md_path.read_text())
    click.echo(f"wrote {md_path} and {csv_path}")


def _is_store(path: Path) -> bool:
    """A profiling results folder: records, or a --profile run's plan table and
    metadata (a search's own plans.csv alone is not one)."""
    return (path / store.RESULTS_FILE).is_file() or (
        (path / store.PLANS_FILE).is_file() and (path / store.META_FILE).is_file())
