"""Low-precision training recipes, FP8 and NVFP4: which one a run uses, where it
can run, what it costs.

The recipe decides how Transformer Engine scales FP8 tensors (Megatron
``--fp8-recipe``): ``delayed`` (amax history of earlier steps), ``tensorwise``
(current scaling: the tensor's own amax, one more pass over it), ``mxfp8``
(a scale per 32 elements, Blackwell's block-scaled tensor cores) and
``blockwise`` (1x128 / 128x128 blocks). Recipes differ in their quantisation
traffic (heuristics/fp8.yaml ``cast_bytes_per_element``) and, where scales
enter the GEMM's main loop in software (blockwise on Hopper), in the GEMMs'
own speed (``gemm_time_vs_per_tensor``, measured).

NVFP4 (``--precision nvfp4``, Megatron ``--fp4-format e2m1 --fp4-recipe nvfp4``)
is one recipe of its own (heuristics/fp8.yaml ``nvfp4``): 4-bit elements with
16-element block scales on Blackwell's FP4 tensor cores.
"""

from functools import lru_cache

from autoconfig.errors import CatalogError, InputError
from autoconfig.heuristics import heuristics_path, load_heuristics, sourced_entry
from autoconfig.yamlio import sourced_field

FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
ALIASES = {"current": "tensorwise", "current-scaling": "tensorwise", "subchannel": "blockwise"}
"""Other names users and tables give the recipes (Megatron-Bridge: fp8_cs, fp8_sc)."""


def recipe_name(name: str, where: str = "--fp8-recipe") -> str:
    """The canonical recipe name; InputError naming the allowed ones."""
    canonical = ALIASES.get(name, name)
    if canonical not in FP8_RECIPES:
        raise InputError(f"invalid {where} {name!r}: allowed are {', '.join(FP8_RECIPES)} "
                         f"(or {', '.join(ALIASES)})")
    return canonical


@lru_cache(maxsize=None)
def _table(key: str) -> dict:
    data = load_heuristics("fp8")
    where = str(heuristics_path("fp8"))
    raw = data.get(key)
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: missing mapping {key!r}")
    if key == "generations":
        return {name: tuple(sourced_field(raw, name, where)[0]) for name in raw}
    if key == "expert_quantisation_kernels":
        return {name: _quant_kernels(sourced_field(raw, name, where)[0], where) for name in raw}
    return {name: sourced_entry(raw, name, where).value for name in raw}


def default_recipe(generation: str) -> str:
    """The recipe the stacks run on ``generation`` when none is asked for."""
    defaults = _table("default_recipe")
    if generation not in defaults:
        raise InputError(f"no FP8 recipe for GPU generation {generation!r}: heuristics/fp8.yaml "
                         f"default_recipe has {', '.join(defaults)}")
    return recipe_name(str(defaults[generation]), "heuristics/fp8.yaml default_recipe")


def run_recipe(asked: str, gpu) -> str:
    """The recipe a run on ``gpu`` uses: ``asked`` (empty: the generation's
    default), checked against the generations that can run it."""
    recipe = recipe_name(asked) if asked else default_recipe(gpu.generation)
    allowed = _table("generations").get(recipe, ())
    if gpu.generation not in allowed:
        raise InputError(f"invalid --fp8-recipe {recipe} on {gpu.name} ({gpu.generation}): it "
                         f"runs on {', '.join(allowed)} GPUs only")
    return recipe


def cast_bytes_per_element(recipe: str) -> float:
    """HBM bytes per GEMM-input element the recipe's quantisation moves."""
    return float(_table("cast_bytes_per_element")[recipe_name(recipe)])


@lru_cache(maxsize=None)
def _gemm_times() -> dict[str, dict[str, float]]:
    data = load_heuristics("fp8")
    where = str(heuristics_path("fp8"))
    raw = data.get("gemm_time_vs_per_tensor")
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: missing mapping 'gemm_time_vs_per_tensor'")
    table = {}
    for generation, recipes in raw.items():
        if not isinstance(recipes, dict):
            raise CatalogError(f"{where}: gemm_time_vs_per_tensor {generation!r} is not a "
                               "mapping of recipes")
        table[generation] = {}
        for recipe in recipes:
            value = sourced_entry(recipes, recipe, where).value
            if isinstance(value, str) or value < 1.0:
                raise CatalogError(f"{where}: gemm_time_vs_per_tensor {generation}.{recipe} "
                                   f"{value!r} is not a number >= 1")
            table[generation][recipe_name(recipe, where)] = float(value)
    return table


def gemm_time_vs_per_tensor(recipe: str, generation: str) -> float:
    """How much longer the recipe's FP8 GEMMs take than per-tensor scaling's on
    ``generation`` (1.0 where the scales cost the GEMM nothing)."""
    return _gemm_times().get(generation, {}).get(recipe_name(recipe), 1.0)


@lru_cache(maxsize=None)
def _nvfp4() -> dict:
    """heuristics/fp8.yaml ``nvfp4``: its generations and bytes per element."""
    where = str(heuristics_path("fp8"))
    raw = load_heuristics("fp8").get("nvfp4")
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: missing mapping 'nvfp4'")
    table = {"generations": tuple(sourced_field(raw, "generations", where)[0])}
    for key in ("input_bytes_per_element", "cast_bytes_per_element",
                "fp4_time_beyond_peak_vs_fp8"):
        value = sourced_entry(raw, key, where).value
        if isinstance(value, str) or value <= 0:
            raise CatalogError(f"{where}: nvfp4 {key} {value!r} is not a positive number")
        table[key] = float(value)
    table["expert_quantisation_kernels"] = _quant_kernels(
        sourced_field(raw, "expert_quantisation_kernels", where)[0], where)
    return table


def _quant_kernels(entry, where: str) -> tuple[float, float]:
    """(per_expert, per_group) of one ``expert_quantisation_kernels`` entry."""
    if not isinstance(entry, dict) or set(entry) != {"per_expert", "per_group"} or any(
            isinstance(v, (str, bool)) or not isinstance(v, (int, float)) or v < 0
            for v in entry.values()):
        raise CatalogError(f"{where}: expert_quantisation_kernels {entry!r} is not a mapping of "
                           "per_expert and per_group to counts >= 0")
    return float(entry["per_expert"]), float(entry["per_group"])


def expert_quantisation_kernels(workload, software, gpu) -> tuple[float, float]:
    """(per local expert, per group of experts) kernels the run's recipe launches to
    quantise one input of the experts' grouped GEMMs; (0, 0) in bf16. Current
    scaling computes each expert's amax and scale before its cast (3 kernels an
    expert), MXFP8 and blockwise cast each expert's slice in one kernel, delayed
    scaling casts every slice in one fused kernel, NVFP4 in grouped kernels
    (heuristics/fp8.yaml ``expert_quantisation_kernels``)."""
    if workload.precision == "nvfp4":
        return _nvfp4()["expert_quantisation_kernels"]
    recipe = workload_recipe(workload, software, gpu)
    if recipe is None:
        return 0.0, 0.0
    return _table("expert_quantisation_kernels")[recipe]


def nvfp4_value(key: str) -> float:
    """One number of heuristics/fp8.yaml ``nvfp4`` (bytes per element)."""
    return _nvfp4()[key]


def check_nvfp4(gpu) -> None:
    """InputError unless ``gpu`` has FP4 tensor cores and a confirmed NVFP4 peak."""
    allowed = _nvfp4()["generations"]
    if gpu.generation not in allowed:
        raise InputError(f"invalid precision 'nvfp4' on {gpu.name} ({gpu.generation}): it "
                         f"runs on {', '.join(allowed)} GPUs only")
    gpu.peak_tflops("nvfp4")


def nvfp4_gemm_speedup(fp8_gemm_speedup: float, gpu) -> float:
    """How much faster NVFP4 GEMMs compute than bf16 ones: the FP8 speed-up
    over the time an NVFP4 GEMM takes against the same FP8 one, r + o: its
    MMAs at the dense FP4 rate (r = FP8 peak / FP4 peak: 1/2 on B200 and
    GB200, 1/3 on GB300) and a part that does not speed up with them
    (``fp4_time_beyond_peak_vs_fp8``, o = 0.19, measured on a B300: 1.90x
    MXFP8 where the peaks differ 3x). So a GB200 gains 1.44x over its FP8
    GEMMs, a GB300 1.90x. No fitted constant of its own."""
    ratio = gpu.peak_tflops("fp8") / gpu.peak_tflops("nvfp4")
    return fp8_gemm_speedup / (ratio + nvfp4_value("fp4_time_beyond_peak_vs_fp8"))


def quantised_gemm(precision: str, fp8_gemm_speedup: float, gpu,
                   recipe_time: float = 1.0) -> tuple[float | None, float]:
    """(speed-up over bf16, bytes per input element) of weight GEMMs in
    ``precision``, training's and serving's alike; (None, 2) in bf16. FP8: the
    speed-up over the recipe's GEMM time against per-tensor scaling
    (``gemm_time_vs_per_tensor``), 1-byte inputs. NVFP4: ``nvfp4_gemm_speedup``,
    0.5625-byte inputs."""
    if precision == "nvfp4":
        return (nvfp4_gemm_speedup(fp8_gemm_speedup, gpu),
                nvfp4_value("input_bytes_per_element"))
    if precision == "fp8":
        return fp8_gemm_speedup / recipe_time, 1.0
    return None, 2.0


def quantised_cast_bytes(workload, software, gpu) -> float:
    """HBM bytes per GEMM-input element the run's quantisation moves (0 in bf16)."""
    if workload.precision == "nvfp4":
        return nvfp4_value("cast_bytes_per_element")
    recipe = workload_recipe(workload, software, gpu)
    return 0.0 if recipe is None else cast_bytes_per_element(recipe)


def check_precision(gpu, precision: str) -> None:
    """InputError unless ``gpu`` runs ``precision``: FP4 tensor cores for NVFP4,
    and a catalog peak for any. The one check search, estimate, capacity and
    infer make before pricing anything."""
    if precision == "nvfp4":
        check_nvfp4(gpu)
    else:
        gpu.peak_tflops(precision)


def check_fp8_recipe(software, stack_features, workload, gpu) -> None:
    """InputError for a precision the GPU cannot run (``check_precision``), a
    recipe it cannot run, or one asked (beyond the stack's own) of a run that is
    not FP8."""
    check_precision(gpu, workload.precision)
    if workload.precision == "fp8":
        run_recipe(software.fp8_recipe, gpu)
    elif software.fp8_recipe != stack_features.fp8_recipe:
        raise InputError(f"--fp8-recipe {software.fp8_recipe} needs --precision fp8 (the run "
                         f"is {workload.precision})")


def workload_recipe(workload, software, gpu) -> str | None:
    """The recipe a run uses: None unless it is an FP8 run."""
    if workload.precision != "fp8":
        return None
    return run_recipe(software.fp8_recipe, gpu)


def precision_label(workload, software, gpu) -> str:
    """The precision as reports print it: ``fp8 (mxfp8)`` names the recipe."""
    recipe = workload_recipe(workload, software, gpu)
    return workload.precision if recipe is None else f"{workload.precision} ({recipe})"
