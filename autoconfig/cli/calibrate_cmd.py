"""``autoconfig calibrate RESULTS... -o calibration.yaml``: refit the model's free
constants on what profiling measured (thin: parse, one library call, print)."""

from pathlib import Path

import click
from tabulate import tabulate

from autoconfig.profiling import store


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("calibration.yaml"), show_default=True,
              help="Calibration file to write (give it to search/estimate/capacity/sweep with "
                   "--calibration).")
def calibrate(results, output: Path) -> None:
    """Refit the step-time model's free constants (GEMM efficiency of the GPU
    generation, elementwise traffic, FP8 speed-up, fixed layer costs, achieved
    link bandwidth) on the ok records of one or more profiling result folders,
    bounded and pulled towards the shipped values, and write a calibration file."""
    from autoconfig.profiling.calibrate import calibrate as fit, measured_runs, write_calibration

    cal = fit(measured_runs([store.results_folder(r) for r in results]))
    path = write_calibration(output, cal)
    rows = [[".".join(k), f"{cal.defaults[k]:.4g}", f"{v:.4g}"] for k, v in cal.values.items()]
    click.echo(tabulate(rows, headers=["constant", "shipped", "calibrated"]))
    click.echo(f"\n{len(cal.records)} measured plans on {cal.gpu} ({cal.device}): step-time error "
               f"{cal.before_pct:.1f}% with the shipped constants, {cal.after_pct:.1f}% calibrated")
    if cal.device == "cpu":
        click.echo("note: CPU-proxy measurements: this file will not calibrate GPU predictions",
                   err=True)
    click.echo(f"wrote {path}")
