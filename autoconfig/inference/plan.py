"""Serving plans: one frozen, hashable ``InferencePlan`` and a columnar table of them.

An inference plan is its own type, not flags on the training ``Plan``: a model
replica spans ``tp * pp`` GPUs and serves static batches of ``batch``
requests; ``replicas`` copies of it share the cluster (data parallel serving).
"""

from dataclasses import asdict, dataclass

import numpy as np

from autoconfig.core.plan import SERVING_PRECISIONS
from autoconfig.errors import MAX_SEQ_LEN, InputError, shown
from autoconfig.inference.lengths import check_length_dist
from autoconfig.inference.dispatch import DEFAULT_DISPATCH, check_dispatch
from autoconfig.training.fp8 import nvfp4_value

PLAN_FIELDS = ("tp", "pp", "batch", "replicas", "ep")


@dataclass(frozen=True, order=True)
class InferencePlan:
    """One serving layout (Megatron terms)."""

    tp: int
    """Tensor-parallel size of a replica."""
    pp: int
    """Pipeline-parallel size of a replica."""
    batch: int
    """Requests per static batch of one replica."""
    replicas: int = 1
    """Model copies on the cluster (GPUs // (tp * pp))."""
    ep: int = 1
    """MoE models: GPUs the routed experts of a pipeline stage are spread over,
    E/ep whole experts each (megatron-core expert parallelism with expert tensor
    parallelism 1), across the tp ranks of ``ep / tp`` replicas whose attention
    stays data parallel; 1: every replica holds all experts split over its tp
    ranks (expert tensor parallelism = tp)."""

    def __post_init__(self) -> None:
        for name in PLAN_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise InputError(f"invalid {name} {value!r}: must be a positive integer")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    def to_dict(self) -> dict:
        return {k: int(v) for k, v in asdict(self).items()}

    def label(self) -> str:
        """Compact display form (``tp8 pp4 b64 x1``); everything is keyed on the plan."""
        experts = f" ep{self.ep}" if self.ep > 1 else ""
        return f"tp{self.tp} pp{self.pp}{experts} b{self.batch} x{self.replicas}"


@dataclass(frozen=True)
class InferenceWorkload:
    """What each request is: prompt and generated lengths, and the number format."""

    input_len_tokens: int
    output_len_tokens: int
    precision: str = "bf16"
    """Weights and KV cache in bf16 (2 bytes) or fp8 (1 byte)."""
    input_len_std_tokens: float = 0.0
    """Spread of the prompt lengths (standard deviation; 0: every prompt the mean)."""
    output_len_std_tokens: float = 0.0
    """Spread of the output lengths; the lengths above are then the means."""
    length_dist: str = "gamma"
    """Law of a job's spread lengths: gamma (a dataset's long tail) or uniform (a
    synthetic random set), ``autoconfig.inference.lengths``."""
    dispatch: str = DEFAULT_DISPATCH
    """How a router spreads the requests over replicas (round-robin or random),
    which decides how bunched one replica's arrivals are
    (``autoconfig.inference.dispatch``)."""

    def __post_init__(self) -> None:
        for name in ("input_len_tokens", "output_len_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not 1 <= value <= MAX_SEQ_LEN:
                flag = "--" + name.replace("_len_tokens", "-len")
                raise InputError(f"invalid {flag} {shown(value)}: must be a positive integer up "
                                 f"to {MAX_SEQ_LEN}")
        for name in ("input_len_std_tokens", "output_len_std_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 <= value <= MAX_SEQ_LEN:
                flag = "--" + name.replace("_len_std_tokens", "-len-std")
                raise InputError(f"invalid {flag} {shown(value)}: must be a number of tokens "
                                 f"from 0 to {MAX_SEQ_LEN}")
        check_length_dist(self.length_dist)
        check_dispatch(self.dispatch)
        if self.precision not in SERVING_PRECISIONS:
            raise InputError(f"invalid precision {self.precision!r}: allowed are "
                             f"{', '.join(SERVING_PRECISIONS)}")

    @property
    def total_len_tokens(self) -> int:
        return self.input_len_tokens + self.output_len_tokens

    @property
    def held_output_tokens(self) -> float:
        """Output tokens a request in flight has written, on average over requests in
        flight at steady state: a request is in flight for a time proportional to its
        output, so the mean is length-biased, ``E[O^2] / (2 E[O]) = (mean^2 + std^2)
        / (2 mean)``: half the output with fixed lengths, the whole mean when the
        lengths spread exponentially (std = mean)."""
        mean, std = self.output_len_tokens, self.output_len_std_tokens
        return (mean * mean + std * std) / (2.0 * mean)

    @property
    def weight_bytes_per_value(self) -> float:
        """Bytes of one weight: 2 (bf16), 1 (fp8), 0.5625 (nvfp4: a 4-bit element
        and a 1-byte scale per 16, heuristics/fp8.yaml ``nvfp4``)."""
        if self.precision == "nvfp4":
            return nvfp4_value("input_bytes_per_element")
        return 1.0 if self.precision == "fp8" else 2.0

    @property
    def kv_bytes_per_value(self) -> float:
        """Bytes of one KV-cache element: FP8 beside FP8 or NVFP4 weights (the
        engines' FP4 checkpoints keep an FP8 KV cache), else bf16."""
        return 2.0 if self.precision == "bf16" else 1.0


@dataclass(frozen=True)
class InferencePlanTable:
    """Many plans as numpy int64 columns, for vectorised evaluation."""

    tp: np.ndarray
    pp: np.ndarray
    batch: np.ndarray
    replicas: np.ndarray
    ep: np.ndarray

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @classmethod
    def from_plans(cls, plans) -> "InferencePlanTable":
        return cls(**{name: np.array([getattr(p, name) for p in plans], dtype=np.int64)
                      for name in PLAN_FIELDS})

    def plan(self, i: int) -> InferencePlan:
        return InferencePlan(**{name: int(getattr(self, name)[i]) for name in PLAN_FIELDS})

    def take(self, index) -> "InferencePlanTable":
        return InferencePlanTable(**{name: getattr(self, name)[index] for name in PLAN_FIELDS})


def stage_layers(num_layers: int, pp):
    """Layers of a plan's heaviest pipeline stage (arrays allowed): ceil(L / pp).
    It sets a stage's step time and a GPU's weights and KV cache; where pp
    divides L every stage holds L / pp, and an engine that deals the rest
    unevenly (``Engine.pipeline_layers``) gives some stages one layer less,
    or the last fewer (FasterTransformer), so they wait on the heaviest."""
    return np.ceil(num_layers / np.asarray(pp, dtype=float))
