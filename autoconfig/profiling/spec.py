"""What one profiling run is asked to do (ProfileSpec) and what it measured (ProfileResult).

Plain frozen dataclasses with a JSON round trip, so a spec can travel to a
subprocess or an sbatch job and a result back, keyed by the Plan itself.
No torch import here.
"""

import json
from dataclasses import asdict, dataclass, fields

from autoconfig.errors import InputError
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan, Workload
from autoconfig.training.context_parallel import CP_COMM_TYPES
from autoconfig.training.stack import MOE_DISPATCHERS

DEVICES = ("cuda", "cpu")
STATUSES = ("ok", "oom", "timeout", "error", "cancelled", "node_fail")


@dataclass(frozen=True)
class ProfileSpec:
    """One profiling run: model shape, batch, plan and device."""

    model: ModelSpec
    """The shape actually run (on CPU: the scaled-down proxy, see proxy.py)."""
    workload: Workload
    """Global batch, sequence length and precision actually run."""
    plan: Plan
    device: str
    """"cuda" (NCCL, bf16) or "cpu" (gloo, fp32)."""
    warmup_steps: int = 2
    timed_steps: int = 3
    seed: int = 1234
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    moe_dispatcher: str = "allgather"
    """MoE models: the token dispatcher the stack runs (``stack.MOE_DISPATCHERS``); the
    worker runs it on GPUs and, on CPU, falls back to one that runs there."""
    moe_grouped_gemm: bool = False
    """MoE models: the stack's grouped GEMM (TransformerEngine's, GPUs only)."""
    cp_comm_type: str = "p2p"
    """CP > 1: the stack's context-parallel scheme (``context_parallel.CP_COMM_TYPES``),
    run where Transformer Engine's attention runs (GPUs)."""
    cp_a2a_size: int = 1
    """a2a+p2p: ranks of each all-to-all group (``context_parallel.a2a_group_size``)."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise InputError(f"invalid device {self.device!r}: allowed are {', '.join(DEVICES)}")
        if self.warmup_steps < 0:
            raise InputError(f"invalid warmup steps {self.warmup_steps}: must be >= 0")
        if self.timed_steps < 1:
            raise InputError(f"invalid timed steps {self.timed_steps}: must be >= 1")
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise InputError(f"invalid cp comm type {self.cp_comm_type!r}: allowed are "
                             f"{', '.join(CP_COMM_TYPES)}")
        if self.cp_a2a_size < 1 or self.plan.cp % self.cp_a2a_size:
            raise InputError(f"invalid cp a2a size {self.cp_a2a_size}: must divide cp "
                             f"{self.plan.cp}")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise InputError(f"invalid MoE dispatcher {self.moe_dispatcher!r}: allowed are "
                             f"{', '.join(MOE_DISPATCHERS)}")

    @property
    def world_size(self) -> int:
        return self.plan.num_gpus

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ProfileSpec":
        data = json.loads(text)
        return cls(model=ModelSpec(**data.pop("model")), workload=Workload(**data.pop("workload")),
                   plan=Plan(**data.pop("plan")), **data)


@dataclass(frozen=True)
class ProfileResult:
    """What one profiling run measured; figures are None unless status is "ok"."""

    plan: Plan
    status: str
    """ok, oom, timeout, error, cancelled or node_fail."""
    device: str
    """Where it ran: "cpu" figures are a scaled-down proxy, not GPU figures."""
    world_size: int
    step_time_s: float | None
    """Median of the timed iterations (each the slowest rank's time)."""
    iteration_times_s: tuple[float, ...]
    """Every iteration, warm-up first."""
    tokens_per_s_per_gpu: float | None
    model_tflops_per_gpu: float | None
    """Model FLOPs (no recompute) per second per GPU / 1e12."""
    peak_memory_bytes: int | None
    """Max over ranks: on GPU the device memory at the peak (the allocator's
    reserved peak plus what it does not hold: CUDA context, cuBLAS and NCCL
    buffers), what nvidia-smi shows and the memory model predicts; on CPU the
    resident set size."""
    losses: tuple[float, ...]
    """Loss per iteration (mean over every token of the global batch)."""
    error: str = ""
    """Tail of the error when status is not ok."""
    model_name: str = ""
    moe_dispatcher: str = ""
    """MoE models: the token dispatcher that actually ran (on CPU it may differ from
    the stack's, see ``run_notes``); empty for dense models."""
    run_notes: str = ""
    """What the run changed from the plan's stack or model, in words (a CPU
    dispatcher fallback, multi-latent attention run as GQA...); empty if nothing."""
    peak_allocated_bytes: int | None = None
    """GPU runs: max over ranks of the tensors' own peak (``max_memory_allocated``),
    the memory model's total less fragmentation and context; None on CPU and in
    records written before it was kept."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise InputError(f"invalid status {self.status!r}: allowed are {', '.join(STATUSES)}")

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["plan"] = self.plan.to_dict()
        data["iteration_times_s"] = list(self.iteration_times_s)
        data["losses"] = list(self.losses)
        return data

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileResult":
        data = dict(d)
        data["plan"] = Plan(**data["plan"])
        data["iteration_times_s"] = tuple(float(t) for t in data.get("iteration_times_s", ()))
        data["losses"] = tuple(float(x) for x in data.get("losses", ()))
        return cls(**data)

    @classmethod
    def failed(cls, spec: ProfileSpec, status: str, error: str, world_size: int | None = None,
               iteration_times_s: tuple[float, ...] = (), losses: tuple[float, ...] = ()
               ) -> "ProfileResult":
        """A record for a run that did not finish (still keyed by its plan)."""
        return cls(plan=spec.plan, status=status, device=spec.device,
                   world_size=spec.world_size if world_size is None else world_size,
                   step_time_s=None, iteration_times_s=iteration_times_s,
                   tokens_per_s_per_gpu=None, model_tflops_per_gpu=None, peak_memory_bytes=None,
                   losses=losses, error=error, model_name=spec.model.name)
