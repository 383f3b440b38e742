"""Validation against published runs: row conversion, statistics, and the real CLI."""

import csv
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoconfig.core.model import hardware_flops_per_token
from autoconfig.validation.runs import load_runs, row_to_run
from autoconfig.validation.scoring import (default_runs_path, evaluate_rows, rank_groups, spearman,
                                   validate)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runs():
    return {r.record_id: r for r in load_runs(default_runs_path())}


def test_shipped_rows_are_verbatim_copies_of_the_shared_data():
    # the shared data sits beside the repository (../shared), wherever it is checked out
    shared = ROOT.parent / "shared" / "data" / "published_runs.csv"
    try:
        with open(shared, newline="") as handle:
            source = {row["record_id"]: row for row in csv.DictReader(handle)}
    except OSError:
        pytest.skip("shared data not on this machine")
    # Rows added here (the MoE runs, S18 and S19 in benchmarks/SOURCES.md) and the
    # columns they brought (empty for the shared rows) are not in the shared file,
    # except a setting read from the recipe of a shared row's release where its table
    # leaves it out (``recipe_settings``), which SOURCES.md names by record id.
    sources = (ROOT / "benchmarks" / "SOURCES.md").read_text()
    with open(default_runs_path(), newline="") as handle:
        for row in csv.DictReader(handle):
            if row["record_id"] not in source:
                assert f"## {row['source_id']}:" in sources, row["record_id"]
                continue
            shared_row = source[row["record_id"]]
            assert {k: row[k] for k in shared_row} == shared_row
            added = [k for k in row if k not in shared_row and row[k]]
            assert added in ([], ["recipe_settings"]), (row["record_id"], added)
            if added:
                assert row["record_id"] in sources, row["record_id"]


def _shipped_row(record_id):
    with open(default_runs_path(), newline="") as handle:
        return next(row for row in csv.DictReader(handle) if row["record_id"] == record_id)


def test_a_recipe_setting_fills_only_what_the_table_leaves_out():
    # A table that gives PP 4 and no VP, whose release's recipe runs VP 5 (the case of
    # a shared row of a release kept aside, SOURCES.md S08): the recipe fills the VP...
    row = {**_shipped_row("R0107"), "vp": "", "recipe_settings": "vp=5"}
    plan = row_to_run(row).plan
    assert (plan.vp, plan.pp, plan.tp) == (5, 4, 1)
    # ...but never overrides what the table states
    assert row_to_run({**row, "vp": "2"}).plan.vp == 2


def test_no_row_of_a_release_kept_aside_is_shipped():
    """Megatron-Bridge performance tables of releases before 26.04 score the model
    outside this repository (SOURCES.md S08)."""
    with open(default_runs_path(), newline="") as handle:
        rows = list(csv.DictReader(handle))
    releases = 0
    for row in rows:
        release = re.search(r"NeMo (\d+)\.(\d+)(?:\.(\d+))? container", row["source_location"])
        if release:
            releases += 1
            assert tuple(int(x or 0) for x in release.groups()) >= (26, 4, 0), row["record_id"]
    assert releases >= 10


def test_narayanan_table1_row_assumptions(runs):
    run = runs["R0007"]  # 145.6B, 1536 GPUs, TP8 PP8, batch 2304
    assert run.usable
    p = run.plan
    assert (p.tp, p.pp, p.dp, p.mbs, p.recompute) == (8, 8, 24, 1, "full")
    assert p.vp == 2  # interleaved: smallest chunking of 10 layers per stage
    assert run.measure == "hardware_tflops_per_gpu" and run.measured == 148
    assert run.workload.global_batch_size == 2304 and run.model.vocab_size == 51200


def test_mp_size_split_and_exclusions(runs):
    jan = runs["R0052"]  # 291B, mp 144 -> TP8 PP18
    assert (jan.plan.tp, jan.plan.pp, jan.plan.vp) == (8, 18, 1)
    assert "ZeRO-3" in runs["R0011"].skip_reason
    assert "V100" in runs["R0055"].skip_reason
    assert not runs["R0023"].usable  # TP/PP not stated
    # NVFP4 rows of dense Llamas are scored as nvfp4 runs (no longer skipped)
    nvfp4 = [r for r in runs.values() if r.source_id == "S08" and r.workload is not None
             and r.workload.precision == "nvfp4"]
    assert len(nvfp4) == 4 and all(r.usable for r in nvfp4)
    assert not any("NVFP4" in r.skip_reason for r in runs.values())
    # their recipes turn TP comm-GEMM overlap off (recipe_settings), the FP8 ones keep it
    assert {r.software.tp_comm_overlap for r in nvfp4} == {False}
    assert runs["R0123"].software.tp_comm_overlap and runs["R0123"].plan.tp == 2
    assert runs["R0582"].throughput_benchmark is False  # CI deterministic mode


def test_hardware_tflops_prediction_uses_eq3_flops(runs):
    run = runs["R0001"]
    rows = evaluate_rows([run])
    row = rows[0]
    tokens = run.workload.tokens_per_step
    flops = hardware_flops_per_token(run.model, 2048, "full") * tokens
    expected = flops / row.predicted_step_s / run.cluster.num_gpus / 1e12
    assert row.predicted == pytest.approx(expected)
    # the measured TFLOP/s turned into a step time with the same FLOP count
    assert row.measured_step_s == pytest.approx(flops / (137e12 * run.cluster.num_gpus))


def test_inconsistent_bloom_rows_are_rejected():
    row = {"record_id": "X", "source_id": "S10", "model_name": "m", "num_layers": "6",
           "hidden_size": "14336", "num_heads": "64", "vocab_size": "250k", "seq_len": "2048",
           "gpu_type": "A100-SXM4-80GB", "num_gpus": "8", "tp": "8", "pp": "1",
           "global_batch_size": "2048", "micro_batch_size": "2", "precision": "bf16",
           "step_time_s": "130.43", "tflops_per_gpu": "143.48",
           "tflops_kind": "hardware TFLOPs", "mem_gb_measured": "54"}
    assert "disagree" in row_to_run(row).skip_reason
    row["step_time_s"] = str(96 * 2048 * 2048 * 6 * 14336 ** 2
                             * (1 + 2048 / (6 * 14336) + 250880 / (16 * 6 * 14336))
                             / (8 * 143.48e12))
    assert row_to_run(row).usable


def test_rows_unusable_for_throughput_still_measure_memory(runs):
    oom = runs["R0493"]  # BLOOM TP2 PP6 MBS2: OOM, no throughput
    assert not oom.usable and oom.memory_usable and oom.oom
    assert oom.plan is not None and oom.plan.distributed_optimizer
    assert runs["R0404"].software.framework == "megatron-deepspeed"
    assert runs["R0007"].software.framework == "megatron-core"


def test_ci_vocab_padded_to_128_times_tp(runs):
    assert runs["R0581"].model.vocab_size == 131200   # tp1: 131073 -> multiple of 128
    assert runs["R0584"].model.vocab_size == 131584   # tp4: multiple of 512


def test_llama_rows_train_without_dropout(runs):
    llama = next(r for r in runs.values() if r.source_id == "S08" and r.model is not None)
    assert llama.model.hidden_dropout == 0.0 and llama.model.attention_dropout == 0.0
    assert runs["R0007"].model.hidden_dropout == 0.1


def test_equal_measured_rates_give_equal_measured_step_times(runs):
    a = runs["R0130"]  # 405B on 256 GB200, 793 tokens/s/GPU
    b = row_to_run({**_shipped_row("R0130"), "record_id": "X0130"})  # the same rate again
    assert a.measured == b.measured
    rows = evaluate_rows([a, b])
    assert rows[0].measured_step_s == rows[1].measured_step_s  # a tie, not float noise
    assert rows[0].measured_step_s == pytest.approx(
        a.workload.tokens_per_step / a.cluster.num_gpus / 793)


def test_spearman_plain_numbers():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_report_covers_every_source_and_groups_have_distinct_plans():
    report = validate()
    assert {"S01", "S10", "S15", "S08"} <= set(report.mape_by_source())
    assert all(np.isfinite(r.abs_pct_error) for r in report.rows)
    assert len(report.rows) >= 100
    for group in report.groups:
        assert len(group.record_ids) >= 2
    assert any(g.key.startswith("S10") for g in report.groups)
    regrouped = rank_groups(list(report.ranking_rows), min_size=3)
    assert all(len(g.record_ids) >= 3 for g in regrouped)


def test_rank_groups_keep_fp8_recipes_apart_but_compare_bf16_with_fp8(runs):
    """The model runs MXFP8 and FP8 alike, so an MXFP8 row never ranks against an FP8
    plan; bf16 and FP8 (which it tells apart) share a group."""
    from autoconfig.validation.scoring import group_key
    assert runs["R0130"].fp8_recipe == "mxfp8" and runs["R0102"].fp8_recipe == ""
    row = _shipped_row("R0132")  # 405B on 256 GB200, FP8
    tensorwise = row_to_run({**row, "precision": "FP8-CS"})
    assert tensorwise.fp8_recipe == "tensorwise" and tensorwise.software.fp8_recipe == "tensorwise"
    assert row_to_run({**row, "precision": "FP8 alt. quantization granularity (32x32 blocks)"}
                      ).fp8_recipe == "blockwise"
    # a table that does not say which granularity ran: the stack's default recipe
    assert row_to_run({**row, "precision": "FP8 (granularity not stated)"}).fp8_recipe == ""
    assert group_key(runs["R0130"]) != group_key(runs["R0102"])
    assert group_key(runs["R0130"]) == group_key(row_to_run({**row, "precision": "MXFP8"}))
    assert runs["R0258"].workload.precision == "fp8" and runs["R0234"].workload.precision == "bf16"
    h100_144 = [r for r in runs.values() if r.usable and r.source_id == "S09"
                and group_key(r).endswith("8xh100-80gb gbs144")]
    assert {r.workload.precision for r in h100_144} == {"bf16", "fp8"}


def test_validate_cli_prints_mape_lines():
    result = subprocess.run([sys.executable, "-m", "autoconfig", "validate", "--summary"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "MAPE S01:" in out and "MAPE overall:" in out
    assert "rho =" in out
    assert "Memory" in out
    assert "Traceback" not in out + result.stderr
    memory = out[out.index("Memory MAPE per source"):]
    assert "MAPE S10:" in memory and "MAPE S17:" in memory  # per source, one mapping
    assert "OOM rows predicted not to fit" in memory


def test_validate_cli_full_table_lists_rows():
    result = subprocess.run([sys.executable, "-m", "autoconfig", "validate"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "R0007" in result.stdout and "abs % err" in result.stdout


def test_validate_cli_bad_runs_path_is_one_line_error(tmp_path):
    missing = tmp_path / "nope.csv"
    result = subprocess.run([sys.executable, "-m", "autoconfig", "validate", "--runs",
                             str(missing)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope.csv" in lines[0] and lines[0].startswith("error:")
    assert "Traceback" not in result.stderr


def test_llm_foundry_rows_are_pure_fsdp_plans(runs):
    big = runs["R0188"]  # MPT-70B, 512 H100, FULL_SHARD, activation checkpointing
    assert big.usable
    p = big.plan
    assert (p.tp, p.pp, p.cp, p.dp, p.mbs, p.recompute) == (1, 1, 1, 512, 8, "full")
    assert p.distributed_optimizer
    assert big.software.framework == "pytorch-fsdp"
    assert big.software.param_gathers_per_microbatch == 2
    assert big.software.grad_reduce_bytes == 4  # Composer mixed_precision DEFAULT: fp32 reduce
    assert big.measure == "tokens_per_s_per_gpu" and big.measured == 1007
    m = big.model
    shape = (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size)
    assert shape == (80, 8192, 32768, 50368)
    assert m.tied_embeddings and not m.has_bias and m.hidden_dropout == 0.0
    assert runs["R0200"].software.param_gathers_per_microbatch == 1  # SHARD_GRAD_OP
    assert runs["R0197"].plan.recompute == "none"
    assert runs["R0326"].cluster.gpu.name == "a100-40gb"
    assert runs["R0265"].cluster.gpu.name == "a100-80gb"
    assert runs["R0260"].workload.precision == "fp8"


def test_llm_foundry_mfu_counts_the_same_flops_as_the_model(runs):
    """The tables' MFU is (6 N + 12 L h s) FLOPs per token (attention counted whole)
    times tokens/s over the dense peak; autoconfig's model FLOPs agree within 0.5%,
    so tokens/s and MFU compare like with like."""
    from autoconfig.core.model import model_flops_per_token

    with open(default_runs_path(), newline="") as handle:
        rows = {r["record_id"]: r for r in csv.DictReader(handle)}
    for rid in ("R0188", "R0226", "R0264", "R0403"):
        run, row = runs[rid], rows[rid]
        flops = model_flops_per_token(run.model, run.workload.seq_len)
        peak = run.cluster.gpu.peak_tflops(run.workload.precision) * 1e12
        mfu = float(row["tokens_per_s_per_gpu"]) * flops / peak * 100.0
        assert mfu == pytest.approx(float(row["mfu_pct"]), rel=0.01)


def test_llm_foundry_rows_of_every_sequence_length_are_shipped_and_used(runs):
    s09 = [r for r in runs.values() if r.source_id == "S09"]
    assert len(s09) == 216
    assert {r.workload.seq_len for r in s09} == {512, 1024, 2048, 4096, 8192, 16384, 32768,
                                                  65536}
    assert all(r.usable for r in s09)
    # Flash attention, but llm-foundry's kernel, not Transformer Engine's fused path.
    assert all(r.software.flash_attention and r.software.attention_kernel == "llm-foundry"
               for r in s09)


def test_the_fit_loss_is_the_source_balanced_mean_absolute_log_ratio(runs):
    """Absolute, not squared (calibration module docstring): a row 28% off weighs
    about 2.5x one 10% off in its source's mean, not 7x."""
    from autoconfig.training.step_time import load_constants
    from autoconfig.validation.calibration import loss
    picked = [r for r in runs.values() if r.usable and r.source_id in ("S04", "S15")]
    per_source: dict = {}
    for r in evaluate_rows(picked, load_constants()):
        per_source.setdefault(r.run.source_id, []).append(abs(np.log(r.predicted / r.measured)))
    expected = np.mean([np.mean(v) for v in per_source.values()])
    assert loss(picked, load_constants()) == pytest.approx(expected, rel=1e-12)
    squared = np.mean([np.mean(np.square(v)) for v in per_source.values()])
    assert abs(loss(picked, load_constants()) - squared) > 0.01


def test_cross_validation_in_processes_gives_the_serial_figures(runs):
    from autoconfig.training.step_time import load_constants
    from autoconfig.validation.calibration import cross_validate
    picked = [r for r in runs.values() if r.usable and r.source_id in ("S04", "S05", "S15")]
    serial = cross_validate(picked, load_constants(), iterations=4, workers=1)
    parallel = cross_validate(picked, load_constants(), iterations=4, workers=2)
    assert set(serial.held_out_pct) == {"S04", "S05", "S15"}
    assert parallel.held_out_pct == serial.held_out_pct
    assert parallel.held_out_predictions == serial.held_out_predictions
    assert len(serial.held_out_predictions) == len(picked)


def test_a_target_prints_as_many_decimals_as_its_verdict_needs():
    from autoconfig.validation.scoring import Target, format_targets
    rows = [("within-group Spearman (weighted), in-sample", 0.7996, Target(">=", 0.8, False)),
            ("throughput MAPE overall, leave-one-source-out", 6.994, Target("<=", 7.0)),
            ("throughput MAPE overall, in-sample", 7.04, Target("<=", 7.0)),
            ("throughput MAPE S01, in-sample", 3.41, Target("<=", 5.0))]
    lines = format_targets([(name, value, target, target.met(value))
                            for name, value, target in rows])
    assert [target.met(value) for _, value, target in rows] == [False, True, False, True]
    assert "  MISSED  within-group Spearman (weighted), in-sample: 0.7996 (target >= 0.8)" in lines
    assert "  met     throughput MAPE overall, leave-one-source-out: 7.0% (target <= 7%)" in lines
    assert "  MISSED  throughput MAPE overall, in-sample: 7.04% (target <= 7%)" in lines
    assert "  met     throughput MAPE S01, in-sample: 3.4% (target <= 5%)" in lines


def test_without_current_held_out_figures_the_held_out_target_is_missed():
    from autoconfig.validation.scoring import Target, format_targets, targets, validate
    rows = targets(validate(), None)
    name, value, target, met = rows[-1]
    assert isinstance(target, Target) and not met and "--cross-validate" in name
    assert format_targets(rows)[-1].startswith("  MISSED  throughput MAPE overall, "
                                               "leave-one-source-out (not computed")
    assert format_targets(rows)[-1].endswith(": n/a (target <= 7%)")


def test_runs_on_sixteen_nodes_or_more_form_the_at_scale_family(runs):
    """validate prints the runs of 128 GPUs or more apart, where data-parallel
    traffic crosses the network: llm-foundry's 512-GPU MPT-70B row is in it, the
    same model on 32 GPUs is not."""
    from autoconfig.validation.scoring import run_families
    assert runs["R0188"].cluster.num_gpus == 512 and runs["R0207"].cluster.num_gpus == 32
    assert "128 GPUs or more" in run_families(runs["R0188"])
    assert "128 GPUs or more" not in run_families(runs["R0207"])
