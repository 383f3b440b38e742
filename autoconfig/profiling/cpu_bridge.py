"""Bridge megatron-core's CUDA assumptions so its real training code runs on a CPU (gloo).

Used by the worker only when ``device == "cpu"``; NCCL runs on GPUs need none
of this. Every patch is undone when the context exits. Facts behind each patch
(checked with torch 2.13.0 and megatron-core 0.16.1; pin both, since some of
these are private functions): see shared notes "megatron-core on CPU".

1. The model-parallel RNG tracker saves and restores the CUDA generator
   (``model_parallel_cuda_manual_seed``, recompute): map it to the CPU default
   generator. Its generator methods are used directly because
   ``torch.manual_seed`` itself calls the CUDA seeding (it would recurse).
2. ``torch.cuda.current_device()`` is used as a device (grad buffers, p2p):
   return the CPU device; ``torch.cuda.synchronize`` becomes a no-op.
3. Hard-coded ``device="cuda"`` factories and ``.cuda()`` / ``.to("cuda")``
   (schedules, optimizer, grad clipping): a TorchFunctionMode rewrites them to CPU.
4. Dtype checks on ``Tensor.type()`` strings (grad clipping asserts
   'torch.cuda.FloatTensor', the distributed optimizer rejects non-CUDA types):
   the same mode reports the CUDA type string for a bare ``.type()`` call.
5. CUDA streams and events (MoE: the alltoall token dispatcher creates a
   ``torch.cuda.Stream`` for its device-to-host copies in its constructor and
   raises "torch.cuda.Stream requires CUDA support"; shared-expert overlap
   does the same): streams, events and ``torch.cuda.stream(...)`` become
   no-ops, which is what they are on one CPU stream.
6. Host copies that assume a GPU tensor: the alltoall dispatcher turns its
   split sizes into numpy with ``moe_utils.maybe_move_tensor_to_cpu(...,
   as_numpy=True)``, which converts only CUDA tensors; on CPU the splits stay
   tensors and gloo's ``all_to_all_single`` rejects them ("TypeError:
   all_to_all_single(): incompatible function arguments"). The bridged
   helper converts CPU tensors too.
7. Uneven gathers and reduce-scatters (MoE with expert tensor parallelism:
   the alltoall dispatcher gathers each rank's own number of tokens over the
   expert-TP group): ``torch.distributed.all_gather`` with unequal sizes,
   which NCCL does and gloo refuses ("ProcessGroupGloo::allgather: invalid
   tensor size at index 1 (expected (139, 64), got (137, 64))"). The bridged
   helpers pad to the largest part and trim (gather), or all-reduce and keep
   their own part (reduce-scatter): the same result, more traffic.
"""

import contextlib


@contextlib.contextmanager
def cpu_bridge():
    """Patch torch.cuda and megatron-core's RNG helpers for CPU; undo on exit."""
    import torch
    from megatron.core.tensor_parallel import random as mcore_random

    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    generator = torch.default_generator
    original_move = moe_utils.maybe_move_tensor_to_cpu

    def move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor) and not tensor.is_cuda and as_numpy:
            return tensor.numpy()
        return original_move(tensor, as_numpy=as_numpy, record_stream=record_stream)

    even_gather, even_reduce_scatter = (mappings._gather_along_first_dim,
                                        mappings._reduce_scatter_along_first_dim)

    def gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return even_gather(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(n) for n in output_split_sizes]
        padded = input_.new_zeros((max(sizes),) + tuple(input_.shape[1:]))
        padded[:input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])

    def reduce_scatter_along_first_dim(input_, group, input_split_sizes=None,
                                       use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return even_reduce_scatter(input_, group, input_split_sizes, use_global_buffer)
        total = input_.contiguous().clone()
        torch.distributed.all_reduce(total, group=group)
        sizes = [int(n) for n in input_split_sizes]
        return total.split(sizes)[group.rank()].clone()

    patches = [
        (torch.cuda, "get_rng_state", lambda device="cuda": generator.get_state()),
        (torch.cuda, "set_rng_state", lambda new_state, device="cuda": generator.set_state(new_state)),
        (torch.cuda, "manual_seed", lambda seed: generator.manual_seed(int(seed))),
        (torch.cuda, "manual_seed_all", lambda seed: generator.manual_seed(int(seed))),
        (torch.cuda, "current_device", lambda: torch.device("cpu")),
        (torch.cuda, "synchronize", lambda device=None: None),
        (torch.cuda, "Stream", _CpuStream),
        (torch.cuda, "Event", _CpuEvent),
        (torch.cuda, "current_stream", lambda device=None: _CPU_STREAM),
        (torch.cuda, "default_stream", lambda device=None: _CPU_STREAM),
        (torch.cuda, "stream", lambda stream=None: contextlib.nullcontext(stream)),
        # Private megatron-core helpers (tensor_parallel/random.py) that index
        # torch.cuda.default_generators directly.
        (mcore_random, "_get_cuda_rng_state",
         lambda device="cuda", clone=False, graph_safe=False:
         generator.get_state().clone() if clone else generator.get_state()),
        (mcore_random, "_set_cuda_rng_state",
         lambda new_state, device=-1, graph_safe=False: generator.set_state(new_state)),
        (moe_utils, "maybe_move_tensor_to_cpu", move_tensor_to_cpu),
        (token_dispatcher, "maybe_move_tensor_to_cpu", move_tensor_to_cpu),
        (mappings, "_gather_along_first_dim", gather_along_first_dim),
        (mappings, "_reduce_scatter_along_first_dim", reduce_scatter_along_first_dim),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        with _CudaToCpuMode():
            yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


class _CpuEvent:
    """A CUDA event on the one CPU stream: always complete."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _CpuStream:
    """A CUDA stream on CPU: work runs in order, so waiting is a no-op."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event or _CpuEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_CPU_STREAM = _CpuStream()


def _is_cuda_device(device) -> bool:
    import torch
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # A bare int is a CUDA ordinal for factories (torch.cuda.current_device() style).
    return isinstance(device, int) and not isinstance(device, bool)


def _make_mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    cpu = torch.device("cpu")

    class CudaToCpuMode(TorchFunctionMode):
        """Rewrites CUDA placements to CPU and reports CUDA type strings (patches 3 and 4)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name.replace("torch.", "torch.cuda.", 1) if ".cuda." not in name else name
            if _is_cuda_device(kwargs.get("device")):
                kwargs["device"] = cpu
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
                args = (args[0], cpu) + tuple(args[2:])
            return func(*args, **kwargs)

    return CudaToCpuMode


def _CudaToCpuMode():
    return _make_mode_class()()
