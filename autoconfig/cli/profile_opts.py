"""``--profile`` and its flags, for commands that hand plans to profiling.

``profile_options`` adds the flags to a click command and
``pop_profile_options`` takes them out as a ProfileOptions; the sweep itself
is ``autoconfig.profiling.sweep.run_profiling``.
"""

import click

from autoconfig.profiling import executors
from autoconfig.profiling.rank import OBJECTIVES
from autoconfig.profiling.select import DEFAULT_TOP_K
from autoconfig.profiling.spec import DEVICES
from autoconfig.profiling.store import RETRY_CHOICES
from autoconfig.profiling.sweep import LAUNCH_FLAGS, SWEEP_FLAGS, ProfileOptions



def profile_options(func):
    """Add the profiling flags to a click command (they arrive as keyword args;
    ``pop_profile_options(kwargs)`` takes them out as a ProfileOptions)."""
    options = [
        click.option("--profile/--no-profile", default=False, show_default=True,
                     help="Prove the prediction: run short real megatron-core jobs for the "
                          "top plans and rank them by what they measured."),
        click.option("--device", type=click.Choice(DEVICES), default="cuda",
                     show_default=True,
                     help="cpu runs a scaled-down proxy of the model on CPU (gloo): it proves "
                          "plans run and ranks them, but its figures are not GPU figures."),
        click.option("--executor", type=click.Choice(executors.names()), default="local",
                     show_default=True, help="Where jobs run: local processes or SLURM."),
        click.option("--top-k", type=int, default=DEFAULT_TOP_K, show_default=True,
                     help="Plans to profile: the predicted best plus diverse layouts."),
        click.option("--max-runs", type=int, default=None,
                     help="Profile in rounds with at most this many runs: measure, recalibrate "
                          "on what was measured, re-rank the whole grid, measure the best "
                          "unmeasured plans, until the best is proven (--tolerance)."),
        click.option("--tolerance", type=float, default=0.02, show_default=True,
                     help="With --max-runs: stop when the measured best is within this fraction "
                          "of every unmeasured plan's calibrated prediction."),
        click.option("--max-steps", type=int, default=3, show_default=True,
                     help="Timed training steps per job."),
        click.option("--warmup-steps", type=int, default=2, show_default=True,
                     help="Untimed steps first."),
        click.option("--max-minutes", type=int, default=10, show_default=True,
                     help="Time limit of each job in minutes."),
        click.option("--max-parallel", type=int, default=4, show_default=True,
                     help="Jobs running at once (SLURM array parallelism)."),
        click.option("--partition", help="SLURM partition."),
        click.option("--account", help="SLURM account."),
        click.option("--qos", help="SLURM quality of service."),
        click.option("--time-limit", type=int,
                     help="SLURM time limit in minutes (default --max-minutes)."),
        click.option("--measurements", type=click.Path(dir_okay=False),
                     help="With --executor replay: CSV of measured runs (plan columns and "
                          "step_time_s) that answers each profiling job instead of running it."),
        click.option("--slurm-extra", multiple=True, metavar="KEY=VALUE",
                     help="Extra sbatch option, repeatable (e.g. constraint=h100)."),
        click.option("--dry-run", is_flag=True,
                     help="Print the sbatch scripts (or local commands) and submit nothing."),
        click.option("--resume", type=click.Path(file_okay=False),
                     help="Results directory of an earlier --profile run: skip plans with a "
                          "final record, run the rest."),
        click.option("--retry", multiple=True, type=click.Choice(RETRY_CHOICES),
                     help="Run again plans whose final record has this status (repeatable; "
                          "failed: every status but ok), e.g. after raising --max-minutes."),
        click.option("--profile-objective", type=click.Choice(OBJECTIVES), default="throughput",
                     show_default=True,
                     help="Rank measured plans by tokens/s (throughput) or step time (latency)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def pop_profile_options(kwargs: dict) -> ProfileOptions:
    """Take the profiling flags out of a click command's kwargs."""
    keys = set(SWEEP_FLAGS) | set(LAUNCH_FLAGS) | {
        flag for name in executors.names() for flag in executors.get(name).Options.FLAGS}
    return ProfileOptions.from_flags(**{k: kwargs.pop(k) for k in list(kwargs) if k in keys})
