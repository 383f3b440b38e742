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
    if not (path / store.PLANS_FILE).exists() and (path / "profile" / store.PLANS_FILE).exists():
        path = path / "profile"  # the search output folder holding profile/
    if not path.is_dir():
        raise InputError(f"invalid results directory {results_dir!r}: it does not exist")
    if not (path / store.PLANS_FILE).exists() and not (path / store.RESULTS_FILE).exists():
        raise InputError(f"invalid results directory {results_dir!r}: no {store.PLANS_FILE} or "
                         f"{store.RESULTS_FILE} in it (give the folder a --profile run wrote)")
    csv_path, md_path, _ = write_report(path, objective)
    click.echo(md_path.read_text())
    click.echo(f"wrote {md_path} and {csv_path}")
