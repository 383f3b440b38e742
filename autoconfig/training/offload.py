"""Layer-wise activation offloading to host memory (megatron-core ``cpu_offloading``).

With ``--cpu-offloading-num-layers N`` megatron-core wraps the first N transformer
layers in Transformer Engine's CPU-offload context: the tensors a layer saves
for backward are copied to pinned host memory on a side stream as its forward
ends, and copied back, one layer ahead, before its backward. The GPU then holds
the saved activations of the other layers plus the one layer whose copy is in
flight, and each copy runs beside the neighbouring layer's compute: it costs
the step only what it outlasts that layer's forward (on the way out) or
backward (on the way back) at the host link's rate (``GPU.host_link_gb_per_s``:
PCIe each way on x86 nodes, a share of NVLink-C2C on Grace superchips), which
streams like any link at ``comm_bandwidth_efficiency`` of its rate.

megatron-core accepts it only without pipeline parallelism, without activation
recompute and without per-layer CUDA graphs, and for fewer layers than the model
has (``TransformerConfig.__post_init__``, core_v0.16.1): ``check_offload`` says
so in one line instead of pricing what cannot run.
"""

import numpy as np

from autoconfig.errors import InputError


def offloaded_layers(plans, software):
    """Layers per plan whose saved activations go to the host: the software's N on
    one-stage plans (megatron-core offloads without PP), 0 elsewhere."""
    return np.where(plans.pp == 1, float(software.cpu_offload_layers), 0.0)


def held_layers(layers, offloaded):
    """Layers whose saved activations sit on the GPU at the forward's end: those not
    offloaded, plus one offloaded layer whose copy is in flight."""
    offloaded = np.asarray(offloaded, dtype=float)
    return layers - offloaded + np.where(offloaded > 0, 1.0, 0.0)


def exposed_s(offloaded, copy_s, forward_s, backward_s):
    """Seconds one micro-batch waits on its offloaded layers' copies: each layer's
    copy out beyond the next layer's forward, and back beyond the later layer's
    backward, which run beside them."""
    return offloaded * (np.maximum(0.0, copy_s - forward_s)
                        + np.maximum(0.0, copy_s - backward_s))


def host_bytes_per_s(gpu, link_efficiency: float) -> float:
    """What a host copy streams each way (bytes/s)."""
    return gpu.host_link_gb_per_s * 1e9 * link_efficiency


def check_offload(model, gpu, software, *, pp=None, recompute=None) -> None:
    """One-line InputError where megatron-core cannot offload as asked (or the GPU
    has no host-link figure to price it with); pins of ``pp`` or ``recompute``
    (a value or the search's choices) checked where given."""
    n = software.cpu_offload_layers
    if not n:
        return
    flag = f"--cpu-offload-layers {n}"
    if not software.launchable:
        raise InputError(f"{flag} is megatron-core's layer-wise offloading, and the stack runs "
                         f"{software.framework}: use --stack megatron-lm or nemo")
    if model.is_encoder_decoder:
        raise InputError(f"{flag}: offloading an encoder-decoder's activations is not "
                         "modelled; use --cpu-offload-layers 0")
    if n >= model.num_layers:
        raise InputError(f"invalid {flag}: must be fewer than {model.name}'s "
                         f"{model.num_layers} layers (megatron-core keeps the last on the GPU)")
    if software.cuda_graph == "te-scoped":
        raise InputError(f"{flag} cannot run with per-layer CUDA graphs (megatron-core "
                         "allows offloading only beside a whole-iteration graph): use "
                         "--cuda-graph none or full-iteration")
    if gpu.host_link_gb_per_s is None:
        raise InputError(f"{flag}: the GPU catalog has no host-link bandwidth for "
                         f"{gpu.name} (host_link_gb_per_s), so offloading cannot be priced")
    pinned_pp = [p for p in np.atleast_1d(pp if pp is not None else []) if p > 1]
    if pinned_pp:
        raise InputError(f"{flag} cannot run with pipeline parallelism (pp "
                         f"{max(pinned_pp)}): megatron-core offloads only at --pp 1")
    asked = [r for r in np.atleast_1d(recompute if recompute is not None else [])
             if r != "none"]
    if asked:
        raise InputError(f"{flag} cannot run with activation recompute ({asked[0]}): "
                         "megatron-core offloads only with --recompute none")
