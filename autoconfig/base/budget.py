"""Compute budget: how long a model of N parameters takes on T tokens, and its inverse.

C = k N T with N the exact parameter count, T training tokens and k = 6
(Kaplan et al. 2020: forward 2N + backward 4N per token), rated against
model-FLOPs utilisation (MFU); or k = 8 with full activation recomputation
(one more forward, Narayanan et al. 2021 eq. 3), rated against hardware-FLOPs
utilisation (HFU). Days = C / (GPUs x peak x utilisation x 86400); the budget
solve is its inverse: N = days x 86400 x rate / (k T), or with Chinchilla
tokens T = r N, N = sqrt(days x 86400 x rate / (k r)).

Encoder-decoder models (T5) are not charged 6N per token: tokens are counted
as encoder tokens (NeMo's count), and 6N would charge the decoder's weights for
all 512 of them where they see the 128 decoder tokens. Their FLOPs per encoder
token F are the exact count of ``autoconfig.core.model`` (about 0.63 x 6N for
T5 at 512/128), C = F T, and the budget solve searches the family's shapes for
the largest C within the budget.
"""

import math
from dataclasses import dataclass

from autoconfig.bounds import FRACTION, Range, check_number
from autoconfig.errors import InputError
from autoconfig.core.hardware import GPU
from autoconfig.core.model import ModelSpec, active_params, hardware_flops_per_token
from autoconfig.heuristics import Sourced, heuristic, load_heuristics, sourced_number

SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class ComputeRate:
    """How fast a cluster turns FLOPs of the stated formula into training."""

    num_gpus: int
    peak_tflops: float
    """Dense peak per GPU in the training precision."""
    utilisation: float
    """Fraction of peak achieved: MFU for the 6NT formula, HFU for 8NT."""
    utilisation_kind: str
    """``mfu`` or ``hfu``."""
    flops_per_param_token: int
    """k in C = k N T: 6, or 8 with full recompute."""
    utilisation_source: str = ""

    @property
    def flops_per_s(self) -> float:
        return self.num_gpus * self.peak_tflops * 1e12 * self.utilisation

    @property
    def formula(self) -> str:
        return f"{self.flops_per_param_token}NT"

    @property
    def full_recompute(self) -> bool:
        """Rated against hardware FLOPs: every recomputed forward counts."""
        return self.utilisation_kind == "hfu"


def training_flops(params: float, tokens: float, rate: ComputeRate) -> float:
    """C = k N T (k = 6, or 8 with full recompute)."""
    return rate.flops_per_param_token * params * tokens


def days_for_flops(flops: float, rate: ComputeRate) -> float:
    """Wall-clock days to execute ``flops`` at ``rate``."""
    return flops / rate.flops_per_s / SECONDS_PER_DAY


def training_days(params: float, tokens: float, rate: ComputeRate) -> float:
    """Wall-clock days to train ``params`` on ``tokens`` at ``rate``."""
    return days_for_flops(training_flops(params, tokens, rate), rate)


def flops_per_param_token(full_recompute: bool) -> int:
    """k of C = k N T: 6, or 8 with full recompute (heuristics/scaling.yaml)."""
    return int(heuristic("scaling", "flops_per_param_token_full_recompute" if full_recompute
                         else "flops_per_param_token").value)


def flops_per_token(model: ModelSpec, full_recompute: bool) -> float:
    """Training FLOPs of one token: k x the parameters it passes through for a
    decoder-only model (an MoE's active ones); for an encoder-decoder the exact
    model FLOPs per encoder token, plus one forward with full recompute
    (Narayanan et al. 2021 eq. 3)."""
    if model.is_encoder_decoder:
        return hardware_flops_per_token(model, model.seq_len,
                                        "full" if full_recompute else "none")
    return flops_per_param_token(full_recompute) * active_params(model)


def flops_formula(model: ModelSpec, full_recompute: bool) -> str:
    """The formula's name: 6NT or 8NT, or FT (F: an encoder-decoder's FLOPs per
    encoder token) and 4FT/3 with full recompute (one forward more of three)."""
    if model.is_encoder_decoder:
        return "4FT/3" if full_recompute else "FT"
    return f"{flops_per_param_token(full_recompute)}NT"


def max_params_for_tokens(days: float, tokens: float, rate: ComputeRate) -> float:
    """Largest N with k N T <= days x rate: the inverse of :func:`training_days`."""
    return days * SECONDS_PER_DAY * rate.flops_per_s / (rate.flops_per_param_token * tokens)


def max_params_chinchilla(days: float, tokens_per_param: float, rate: ComputeRate) -> float:
    """Largest N with k N (r N) <= days x rate, T = r N tokens (Hoffmann et al. 2022)."""
    budget = days * SECONDS_PER_DAY * rate.flops_per_s
    return math.sqrt(budget / (rate.flops_per_param_token * tokens_per_param))


def default_utilisation(gpu_name: str, precision: str, full_recompute: bool) -> Sourced:
    """The published utilisation of ``heuristics/efficiency.yaml`` for this GPU."""
    data = load_heuristics("efficiency")
    gpus = data.get("gpus") or {}
    entry = gpus.get(gpu_name)
    if not isinstance(entry, dict):
        known = ", ".join(sorted(gpus))
        raise InputError(f"no default efficiency for GPU {gpu_name!r} (known: {known}): "
                         "pass --mfu or --tflops-per-gpu")
    where = f"heuristics/efficiency.yaml gpus.{gpu_name}"
    if full_recompute and precision == "bf16" and "hfu_full_recompute" in entry:
        return sourced_number(entry, "hfu_full_recompute", where)
    key = f"mfu_{precision}"
    if key not in entry:
        raise InputError(f"no default {precision} efficiency for GPU {gpu_name!r}: "
                         "pass --mfu or --tflops-per-gpu")
    # Without a measured full-recompute run the same fraction of peak is assumed.
    return sourced_number(entry, key, where)


def compute_rate(gpu: GPU, num_gpus: int, precision: str, full_recompute: bool,
                 mfu: float | None = None, tflops_per_gpu: float | None = None) -> ComputeRate:
    """The cluster's rate from a given MFU, a given TFLOP/s per GPU, or the default."""
    if mfu is not None and tflops_per_gpu is not None:
        raise InputError("give either --mfu or --tflops-per-gpu, not both")
    peak = gpu.peak_tflops(precision)
    kind = "hfu" if full_recompute else "mfu"
    if mfu is not None:
        # checked here too: a caller may come straight here, past the request's check
        util, source = check_number("--mfu", mfu, FRACTION), "given (--mfu)"
    elif tflops_per_gpu is not None:
        given = check_number("--tflops-per-gpu", tflops_per_gpu, Range(0, peak, low_open=True),
                             f"the {precision} peak of {gpu.name}")
        util, source = given / peak, f"given (--tflops-per-gpu {given:g})"
    else:
        default = default_utilisation(gpu.name, precision, full_recompute)
        util, source = float(default.value), default.source
    k = flops_per_param_token(full_recompute)
    return ComputeRate(num_gpus=num_gpus, peak_tflops=peak, utilisation=util,
                       utilisation_kind=kind, flops_per_param_token=k, utilisation_source=source)
