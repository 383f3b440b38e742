"""The model's accuracy on the published runs is pinned, so a change that
worsens it fails CI (and one that improves it must lower the pins).

Pins are the figures measured when the constants were last fitted
(``python benchmarks/fit_perf.py``) plus a stated tolerance of 0.5 percentage
points per source (0.3 overall); the leave-one-source-out store must be current
for the model and inputs as they are (``autoconfig validate --cross-validate``).
"""

import dataclasses

import pytest

from autoconfig.training.step_time import load_constants
from autoconfig.validation import crossval_store
from autoconfig.validation.scoring import validate, weighted_spearman

TOLERANCE_PCT = 0.5
OVERALL_TOLERANCE_PCT = 0.3
PINNED_MAPE_PCT = {"S01": 2.8, "S04": 3.0, "S05": 3.6, "S08": 4.2, "S09": 5.1, "S10": 6.5,
                   "S15": 17.1, "S18": 2.6, "S19": 3.8, "S20": 2.4, "S21": 3.1}
"""Since a training all-reduce's latency is NCCL's (step_time.allreduce_s: 8.4 us a collective
plus 3.4 us an NVLink ring step, where 10 us a step had stood; heuristics/perf.yaml
nvlink_step_latency_s, collective_base_latency_s), refitted: S01 3.4% -> 2.8%, S15 17.6% ->
17.1%, S21 3.2% -> 3.1%; S04 2.7% -> 3.0%, S05 3.4% -> 3.6%; held out S01 4.7% -> 3.3%,
S15 19.4% -> 18.4%, S20 8.4% -> 7.4%, overall 5.8% -> 5.7%.
Since the experts' FP8 quantisations launch their recipe's kernels (heuristics/fp8.yaml
expert_quantisation_kernels: current scaling 3 an expert, amax and scale before the cast;
MXFP8 and blockwise 1; delayed scaling 1 fused for all), refitted: S19 4.4% -> 3.8%
(Qwen3-30B-A3B in current scaling on 16 H100 16-18% -> 8-10% fast), overall 5.3% -> 5.2%.
Since each local expert's kernels are priced (step_time.expert_kernels_s: 6 GEMMs and,
in FP8, 4 quantisations at the 3 us kernel floor plus, outside a whole-iteration CUDA
graph, a 6.4 us launch each; DeepSeek-V3 at EP 8 keeps 32 experts a GPU) and S21's two
BF16 H100 rows joined the MoE fit (per-layer cost 1.39 -> 1.00 ms): S19 8.8% -> 5.2%,
S18 2.8% -> 2.9%, S05 3.5% -> 3.4%; overall 5.8% -> 5.4%. Then the alltoall dispatcher's
two regrouping copies by local expert counted as traffic, refitted: S19 5.2% -> 4.9%,
S18 2.9% -> 2.8%, overall 5.4% -> 5.3%. Then the routed copies' FP8 casts at the recipe's
bytes per element (current scaling 6, MXFP8 4.06, where a flat 3 had stood), refitted
(MoE per-layer cost 1.00 -> 0.95 ms): S19 4.9% -> 4.4%, S18 2.8% -> 2.6%, S21 3.1% -> 3.2%.
Since fused attention's FLOPs follow the heads' widths, 2 s a (d_qk + d_v), instead of
the GPT shape's 4 s h (Qwen3's 128-wide heads on a narrower stream do 2x it, DeepSeek-V3's
MLA heads 2.86x) and the constants were refitted (MoE per-layer cost 2.08 -> 1.39 ms):
S19 10.1% -> 8.7%, S18 4.9% -> 2.8%, S01 3.2% -> 3.4%, S15 18.0% -> 17.6%, S05 3.4% ->
3.5%; overall 6.0% -> 5.8%, held out 6.7% -> 6.5% (S19 10.3% -> 8.9%, S18 7.4% -> 5.4%).
Then FP8 casts counted on each layer's own linears (an MoE layer's shared experts, not a
dense MLP it does not have; MLA's projections; the heads' value width) without a refit:
S19 8.7% -> 8.8%, S18 held out 5.4% -> 5.6%.
Since MT-NLG 530B's three rows (S20, Megatron-DeepSpeed at TP 8 PP 35) joined BLOOM in
fitting Megatron-DeepSpeed's per-layer cost (10.3 -> 6.0 ms) and the constants were
refitted: S20 8.5% -> 2.4%, S10 5.2% -> 6.5%, S01 3.4% -> 3.2%, S15 17.6% -> 18.0%;
overall 5.9% -> 6.0%, held out 7.0% -> 6.7% (S10 10.0% -> 7.7%: with BLOOM left out
the cost is now fitted on MT-NLG instead of falling to zero; S20 held out 8.5%).
Since the FSDP stacks' full recompute stops before each dense layer's down projection,
as PyTorch's non-reentrant checkpoint does (SoftwareFeatures.recompute_early_stop), and
the constants were refitted: S09 6.1% -> 5.1%, S01 3.9% -> 3.4%, S08 4.5% -> 4.2%, S15
16.8% -> 17.6%; overall 6.5% -> 5.9%, held out 8.0% -> 7.0% (S09 7.1% -> 5.4%).
Since the fit minimises the mean absolute log ratio instead of the squared one
(autoconfig.validation.calibration: why): S01 6.0% -> 3.9%, S04 3.9% -> 2.8%, S08 5.2% ->
4.5%, S09 6.5% -> 6.1%, S10 5.6% -> 5.3%, S18 6.0% -> 5.0%; S05 3.3% -> 3.4%, S19 9.8% ->
10.2% and S15 14.3% -> 16.8% (its 175B half, in doubt, no longer sets the Ampere
efficiency); overall 6.8% -> 6.5%, held out 8.3% -> 8.0%.
Since NVFP4 runs are modelled (training.fp8.nvfp4_gemm_speedup, predicted and never
fitted) S08 counts its four NVFP4 rows: 3.0% -> 5.2% over 14 rows (its 10 FP8 rows still
3.0%; the two GB200 405B NVFP4 rows 12-14% slow, the 70B ones 9.1% and 7.4% fast).
Since the FP8 GEMM roofline reads its inputs as 1-byte elements (step_time.gemm_time_s;
small and thin FP8 GEMMs gain less, as measured on an H200) and the constants were
refitted: S08 3.3% -> 3.0%, S18 6.4% -> 6.0%, S19 10.2% -> 9.8%, S15 14.4% -> 14.3%,
S01 5.9% -> 6.0%, S04 3.8% -> 3.9% (held out: overall 8.7% -> 8.3%).
Since the S08 rows of Megatron-Bridge releases before 26.04 left the shipped runs (kept
aside to score the model, benchmarks/SOURCES.md S08) and the constants were refitted:
S08 4.2% -> 3.3% (10 rows left of 28), S15 14.5% -> 14.4%, S18 6.1% -> 6.4%, S19 10.0% ->
10.2%, overall 6.7% -> 6.8%. Before then: S08 counted its GB300 rows since that GPU is in
the catalog (its 21 other rows: 4.0%, 3.9% before the MoE work); S18 and S19 are the
published MoE runs. S10 was 4.8% before Megatron-DeepSpeed's gradient accumulation was
derived instead of fitted. S08 was 4.6% before R0135 took its virtual-pipeline size from
its release's recipe. With the loss's
cross-entropy traffic derived per implementation (heuristics/perf.yaml
cross_entropy_bytes_per_logit) the refit moved S05 from 2.8% to 3.3% (its smallest
model now 6.0% fast: the elementwise factor the loss had partly stood in for fell from
0.50 to 0.39), S01 5.9% -> 5.8%, S09 6.8% -> 6.7%, S08 4.0% -> 4.2%, S19 9.9% -> 10.0%.
With fused attention's measured per-query-tile cost on Hopper (heuristics/perf.yaml
attention_tile_keys; benchmarks/gpu/attention.csv) S09 went 6.7% -> 6.5%, S01 5.8% ->
5.9%, S10 5.5% -> 5.6%, S15 14.6% -> 14.5% (held out: S09 8.8% -> 7.3%, S08 9.6% -> 8.7%)."""
PINNED_OVERALL_PCT = 5.2
PINNED_SPEARMAN = 0.79
"""Size-weighted within-group rank correlation, in-sample (lower bound, 0.02 below).
0.81 since MT-NLG's rows lowered Megatron-DeepSpeed's fitted per-layer cost (BLOOM's
82-layer group of three 0.50 -> 1.00, its 12-row group 0.674 -> 0.68; held out 0.67 -> 0.81).
0.7996 since the early-stopping recompute's refit (BLOOM's 12-row TP 8 / TP 4 group
0.681 -> 0.674: Megatron-DeepSpeed's fitted per-layer cost rose from 8.2 to 10.3 ms).
0.80 since the absolute loss's refit (held out 0.64 -> 0.67).
0.81 since the FP8 GEMM roofline reads 1-byte inputs (the MXFP8 MoE groups of S19 and
the FP8 recipes of S08 order better).
0.77 since the S08 rows of releases before 26.04 left (their GB300 group of three,
rho 0.00, two of them one layout measured in two releases). Before then: 0.77 until the
BLOOM rows run in 16 bits stopped paying the BF16 optimizer's fp32 cast copy, which they
never ran (bigscience tr11-176B-ml chronicles, 'Rebalancing layers'): 0.74 since; 0.72
since the unfused cross entropy on the last stage (250,880 tokens of vocabulary) puts
BLOOM's R0456 (TP 8 PP 12 MBS 4, measured 125.5 s) 0.4% behind R0457 (TP 8 PP 6 MBS 2,
135.6 s) instead of 0.2% ahead: a tie the model cannot split either way."""


def regressions(report) -> list[str]:
    """What got worse than the pins (empty when nothing did)."""
    worse = [f"{source}: {mape:.1f}% > {PINNED_MAPE_PCT[source]}% + {TOLERANCE_PCT}"
             for source, mape in report.mape_by_source().items()
             if mape > PINNED_MAPE_PCT.get(source, 0.0) + TOLERANCE_PCT]
    if report.mape > PINNED_OVERALL_PCT + OVERALL_TOLERANCE_PCT:
        worse.append(f"overall: {report.mape:.1f}% > {PINNED_OVERALL_PCT}%")
    if weighted_spearman(report.groups) < PINNED_SPEARMAN:
        worse.append(f"Spearman {weighted_spearman(report.groups):.2f} < {PINNED_SPEARMAN}")
    return worse


def test_accuracy_holds_the_pins() -> None:
    assert regressions(validate()) == []


@pytest.mark.parametrize("change", [
    {"gemm_efficiency_max": {"ampere": 0.55, "hopper": 0.55, "blackwell": 0.55,
                             "blackwell-ultra": 0.55}},
    {"elementwise_traffic_factor": 1.5},
    {"fp8_gemm_speedup": 1.2},
])
def test_a_worsened_constant_fails_the_pins(change) -> None:
    worse = dataclasses.replace(load_constants(), **change)
    assert regressions(validate(constants=worse))


def test_cross_validation_store_is_current() -> None:
    """A change to the model, its constants or the runs needs its leave-one-source-out
    figures recomputed: `autoconfig validate --cross-validate`."""
    stored, why = crossval_store.load_current()
    assert stored is not None, why
    assert set(stored["held_out_pct"]) == set(PINNED_MAPE_PCT)
