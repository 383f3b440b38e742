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
"""

import contextlib


@contextlib.contextmanager
def cpu_bridge():
    """Patch torch.cuda and megatron-core's RNG helpers for CPU; undo on exit."""
    import torch
    from megatron.core.tensor_parallel import random as mcore_random

    generator = torch.default_generator
    patches = [
        (torch.cuda, "get_rng_state", lambda device="cuda": generator.get_state()),
        (torch.cuda, "set_rng_state", lambda new_state, device="cuda": generator.set_state(new_state)),
        (torch.cuda, "manual_seed", lambda seed: generator.manual_seed(int(seed))),
        (torch.cuda, "manual_seed_all", lambda seed: generator.manual_seed(int(seed))),
        (torch.cuda, "current_device", lambda: torch.device("cpu")),
        (torch.cuda, "synchronize", lambda device=None: None),
        # Private megatron-core helpers (tensor_parallel/random.py) that index
        # torch.cuda.default_generators directly.
        (mcore_random, "_get_cuda_rng_state",
         lambda device="cuda", clone=False, graph_safe=False:
         generator.get_state().clone() if clone else generator.get_state()),
        (mcore_random, "_set_cuda_rng_state",
         lambda new_state, device=-1, graph_safe=False: generator.set_state(new_state)),
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
