"""``autoconfig report DIR``: rebuild the profiling report from a results directory."""


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

    path = store.results_folder(results_dir)
    if not path.is_dir():
        raise InputError(f"invalid results directory {results_dir!r}: it does not exist")
    if not store.is_results_folder(path):
        raise InputError(f"invalid results directory {results_dir!r}: expected the folder a "
                         f"--profile run wrote ({store.RESULTS_FILE}, or {store.PLANS_FILE} with "
                         f"{store.META_FILE}), e.g. OUT/{store.PROFILE_SUBDIR}")
    warnings = [w for w in (store.check_store(path), store.check_meta(path)) if w]
    csv_path, md_path, _ = write_report(path, objective)
    for warning in warnings:   # after: a corrupt plans.csv stays a one-line error
        click.echo(warning, err=True)
    click.echo(md_path.read_text())
    click.echo(f"wrote {md_path} and {csv_path}")

