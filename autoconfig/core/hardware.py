"""Hardware types: one GPU model and the cluster built from it."""

from dataclasses import dataclass

from autoconfig.errors import MAX_COUNT, InputError, shown


@dataclass(frozen=True)
class GPU:
    """Per-GPU figures of one accelerator in its usual DGX/HGX node.

    Bandwidths are per GPU and per direction, in decimal GB/s, as datasheets
    give them (NVLink datasheet totals are bidirectional: we store half).
    """

    name: str
    """Catalog key, e.g. ``h100-80gb``."""
    display_name: str
    peak_bf16_tflops: float
    """Dense BF16/FP16 tensor-core peak (no sparsity)."""
    peak_fp8_tflops: float | None
    """Dense FP8 peak, ``None`` where the GPU has no FP8 tensor cores."""
    hbm_capacity_gb: float
    """HBM capacity in decimal GB, as the datasheet states it."""
    hbm_bandwidth_gb_per_s: float
    nvlink_bandwidth_gb_per_s: float
    """NVLink bandwidth per GPU, one direction."""
    gpus_per_node: int
    """GPUs in the usual node (DGX/HGX baseboard or GB200 compute tray)."""
    nvlink_domain_gpus: int
    """GPUs reachable over NVLink without the scale-out network (72 on NVL72)."""
    internode_bandwidth_gb_per_s: float
    """Scale-out (InfiniBand) bandwidth per GPU, one direction."""
    generation: str
    """Architecture generation: picks the step-time constants (heuristics/perf.yaml)."""
    sm_count: int
    """Streaming multiprocessors: GEMM tiles run in waves of this many."""
    aliases: tuple[str, ...] = ()
    tdp_w: float | None = None
    """Board power (maximum thermal design power) of one GPU in watts, from the
    datasheet; ``None`` for a user's GPU file without it."""
    node_power_w: float | None = None
    """Maximum power of the whole usual node (GPUs, CPUs, NICs, fans) in watts,
    from the system datasheet; ``None`` where none is published."""
    peak_nvfp4_tflops: float | None = None
    """Dense NVFP4 (E2M1 with 16-element block scales) peak, ``None`` where the
    GPU has no FP4 tensor cores or no confirmed figure."""
    peak_fp16_vector_tflops: float | None = None
    """FP16 peak of the CUDA cores (no tensor cores), from the architecture
    whitepaper: what a half-precision GEMM whose operands break the tensor cores'
    16-byte alignment runs at; ``None`` where none is published."""
    host_link_gb_per_s: float | None = None
    """Bandwidth of the GPU's link to its host CPU's memory, each way, in GB/s:
    what activation offloading copies over (PCIe on x86 nodes, NVLink-C2C on
    Grace superchips); ``None`` where the catalog has no figure (offloading is
    then refused, not priced)."""
    cuda_memory_mib: float | None = None
    """Device memory CUDA reports (``torch.cuda.get_device_properties().total_memory``,
    deviceQuery) where it falls short of the datasheet's capacity by more than the
    driver's reservation: GDDR6 boards with ECC on keep 1/16 of it for check bits
    (48 GiB L40S: 45,589 MiB); ``None``: the datasheet capacity rule
    (``autoconfig.training.memory.usable_bytes``)."""

    @property
    def hbm_capacity_bytes(self) -> float:
        return self.hbm_capacity_gb * 1e9

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for ``bf16``, ``fp8`` or ``nvfp4``; a precision the GPU lacks
        is an error."""
        if precision == "bf16":
            return self.peak_bf16_tflops
        if precision in ("fp8", "nvfp4"):
            peak = self.peak_fp8_tflops if precision == "fp8" else self.peak_nvfp4_tflops
            if peak is None:
                lower = "bf16" if precision == "fp8" or self.peak_fp8_tflops is None \
                    else "bf16 or fp8"
                raise InputError(f"precision {precision!r} is not available on {self.name} "
                                 f"(no {precision.upper()} peak in its catalog file): use {lower}")
            return peak
        raise InputError(f"unknown precision {precision!r}: allowed are bf16, fp8, nvfp4")


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster: ``nodes`` nodes of ``gpus_per_node`` GPUs each."""

    gpu: GPU
    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise InputError(f"invalid number of nodes {self.nodes}: must be at least 1")
        if self.gpus_per_node < 1:
            raise InputError(
                f"invalid GPUs per node {self.gpus_per_node}: must be at least 1")
        if self.nodes * self.gpus_per_node > MAX_COUNT:
            raise InputError(f"invalid cluster of {shown(self.nodes)} nodes x "
                             f"{shown(self.gpus_per_node)} GPUs: at most {MAX_COUNT} GPUs")

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs one NVLink domain spans here (never more than the cluster)."""
        return min(max(self.gpus_per_node, self.gpu.nvlink_domain_gpus), self.num_gpus)


def cluster_from_gpus(gpu: GPU, num_gpus: int, gpus_per_node: int) -> Cluster:
    """Build a cluster from a GPU count that must be a whole number of nodes."""
    if not 1 <= num_gpus <= MAX_COUNT:
        raise InputError(f"invalid GPU count {shown(num_gpus)}: must be from 1 to {MAX_COUNT}")
    if num_gpus % gpus_per_node and num_gpus > gpus_per_node:
        raise InputError(
            f"invalid GPU count {num_gpus}: must be a whole number of nodes of "
            f"{gpus_per_node} GPUs (e.g. {gpus_per_node * max(1, num_gpus // gpus_per_node)})")
    if num_gpus < gpus_per_node:
        return Cluster(gpu=gpu, nodes=1, gpus_per_node=num_gpus)
    return Cluster(gpu=gpu, nodes=num_gpus // gpus_per_node, gpus_per_node=gpus_per_node)
