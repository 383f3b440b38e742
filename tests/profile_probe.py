"""A click command, for tests, that sends one plan of the tiny model through
``--profile``'s real option parsing and sweep (no search in front of it)."""

from pathlib import Path

import click

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.cli.profile_opts import pop_profile_options, profile_options
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Plan, Workload
from autoconfig.profiling.sweep import RankedPlan, check_options, run_profiling


def probe_command(name: str, plan: Plan, gpus_per_node: int, global_batch_size: int):
    @click.command(name)
    @profile_options
    @click.option("-o", "out_dir")
    def command(out_dir, **kwargs):
        options = pop_profile_options(kwargs)
        if options.profile:
            check_options(options)   # as search does, before its search
        model = get_model("tiny")
        cluster = Cluster(gpu=get_gpu("h100-80gb"), nodes=1, gpus_per_node=gpus_per_node)
        run_profiling([RankedPlan(plan)], model,
                      Workload(global_batch_size=global_batch_size, seq_len=model.seq_len),
                      cluster, options, Path(out_dir))
    return command
