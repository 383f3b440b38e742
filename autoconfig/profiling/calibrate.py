"""Calibration from measurements: refit the step-time model's free constants on
what profiling measured on the user's own cluster.

The constants are the ones ``validate`` fits (``validation.calibration.FREE``)
that the measurements inform (the GPU generation's large-GEMM efficiency, the
elementwise-traffic factor, the FP8 speed-up, the framework's and MoE layers'
fixed costs), plus the achieved fraction of link bandwidth, which a user's
network sets. Each stays within ``BOUNDS`` and is pulled towards its shipped
value by a prior, so a handful of measurements moves it only as far as they
agree: a multiplicative prior (a factor 1 + PRIOR_SPREAD costs as much as a
typical measurement's squared log error) for efficiencies and factors, an
additive one (PRIOR_SPREAD_S) for fixed seconds.

A calibration file records the constants, the records used, the residuals
before and after, the GPU, the device and the model's fingerprint; it is
refused for another GPU, for GPU predictions when it was fitted on the CPU
proxy, and by a model whose fingerprint differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from autoconfig.atomic import write_atomic
from autoconfig.yamlio import SAFE_LOADER
from autoconfig.core.catalog import get_gpu
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Workload, plan_label
from autoconfig.errors import InputError
from autoconfig.profiling import store
from autoconfig.profiling.calibration_file import file_fields
from autoconfig.training.stack import SoftwareFeatures, load_stack
from autoconfig.training.step_time import PerfConstants, load_constants
from autoconfig.validation.calibration import (BOUNDS, FREE, bounded_fit, get_value, informed,
                                               with_values)
from autoconfig.validation.crossval_store import model_fingerprint
from autoconfig.validation.runs import Run
from autoconfig.validation.scoring import evaluate_rows

KIND = "autoconfig-calibration"
EXTRA_FREE: tuple[tuple[str, ...], ...] = (("comm_bandwidth_efficiency",),)
"""Calibrated beyond ``FREE``: what the user's network achieves."""
EXTRA_BOUNDS = {"comm_bandwidth_efficiency": (0.1, 1.0)}
_ALL_BOUNDS = {**BOUNDS, **EXTRA_BOUNDS}
PRIOR_SPREAD = 0.15
"""Log-space spread of the multiplicative prior (a factor ~1.16 costs 1)."""
PRIOR_SPREAD_S = 0.002
"""Spread of the additive prior on fixed per-layer seconds."""
ITERATIONS = 400


@dataclass(frozen=True)
class Calibration:
    """Fitted constants and what they were fitted on."""

    values: dict
    """Constant key (tuple) -> fitted value."""
    defaults: dict
    """Constant key -> the shipped value it started from."""
    gpu: str
    device: str
    records: tuple
    """One dict per measured plan: store, plan label, measured and predicted step time."""
    before_pct: float
    """Mean absolute step-time error of the shipped constants on the records."""
    after_pct: float
    fingerprint: str

    def constants(self, base: PerfConstants | None = None) -> PerfConstants:
        return with_values(base or load_constants(), self.values)


# ---------------------------------------------------------------- records


def measured_runs(results_dirs) -> list[Run]:
    """One Run per ok record of the stores (its latest record), described by the
    store's meta.json (model, workload, cluster, software) as ``validate`` reads a
    published run."""
    runs = []
    for folder in results_dirs:
        folder = Path(folder)
        if not (folder / store.RESULTS_FILE).is_file():
            raise InputError(f"invalid results folder {folder}: no {store.RESULTS_FILE} there "
                             "(give the profile folder of a --profile run)")
        meta, damaged = store.read_meta(folder)
        if damaged:   # say so, not "does not describe the setting (KeyError: 'model')"
            raise InputError(f"invalid results folder {folder}: {folder / store.META_FILE} is "
                             f"{damaged}; it describes the profiled setting, so profile again "
                             "(or restore the file)")
        model, workload, cluster, software, stack = _setting(meta, folder)
        for record in store.latest_records(folder):
            if record.get("status") != "ok" or not record.get("step_time_s"):
                continue
            plan = store.plan_from_record(record)
            runs.append(Run(record_id=f"{folder}:{plan_label(plan)}", source_id=str(folder),
                            model_name=model.name, model=model, workload=workload, plan=plan,
                            cluster=cluster, stack=stack, software=software,
                            measure="step_time_s", measured=float(record["step_time_s"]),
                            device=str(record.get("device", meta.get("device")))))
    return runs


def _setting(meta: dict, folder: Path):
    """(model, workload, cluster, software, stack) a store's meta.json describes."""
    try:
        model = ModelSpec(**meta["model"])
        workload = Workload(**meta["workload"])
        c = meta["cluster"]
        cluster = Cluster(get_gpu(c["gpu"]), int(c["nodes"]), int(c["gpus_per_node"]))
        stack = str(meta.get("stack") or "megatron-lm")
        software = meta.get("software")
        software = (SoftwareFeatures(**{k: tuple(v) if isinstance(v, list) else v
                                        for k, v in software.items()})
                    if isinstance(software, dict) else load_stack(stack).features)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{folder / store.META_FILE}: does not describe the profiled setting "
                         f"({type(exc).__name__}: {str(exc)[:80]}); profile again with this "
                         "autoconfig") from None
    return model, workload, cluster, software, stack


def device_of(runs: list[Run]) -> str:
    """cuda or cpu; InputError when CPU-proxy and GPU records are mixed (the proxy's
    figures must not move GPU constants)."""
    devices = {r.device for r in runs}
    if "cpu" in devices and devices - {"cpu"}:
        raise InputError("records from the CPU proxy and from GPUs: calibrate the GPU result "
                         "folders alone (CPU figures never calibrate GPU predictions)")
    return "cpu" if "cpu" in devices else "cuda"


# ---------------------------------------------------------------- fit


def free_keys(runs: list[Run]) -> list[tuple[str, ...]]:
    """The constants the runs inform (shared model constants and the network's)."""
    keys = [k for k in FREE if informed(runs, k)]
    return keys + list(EXTRA_FREE)


def _prior_penalty(key, value: float, default: float) -> float:
    if key[0].endswith("_s"):
        return ((value - default) / PRIOR_SPREAD_S) ** 2
    return (math.log(value / default) / PRIOR_SPREAD) ** 2


def _mean_sq_log_error(runs, constants) -> float:
    rows = evaluate_rows(runs, constants)
    return float(np.mean([np.log(r.predicted_step_s / r.measured_step_s) ** 2 for r in rows]))


def calibrate(runs: list[Run], base: PerfConstants | None = None) -> Calibration:
    """Fit the free constants the runs inform, with priors, on their step times."""
    if not runs:
        raise InputError("nothing to calibrate on: no ok record with a measured step time")
    gpus = {r.cluster.gpu.name for r in runs}
    if len(gpus) > 1:
        raise InputError(f"records from several GPUs ({', '.join(sorted(gpus))}): calibrate "
                         "each GPU on its own")
    device = device_of(runs)   # before the fit: CPU and GPU records are never mixed
    base = base or load_constants()
    keys = free_keys(runs)
    defaults = {k: get_value(base, k) for k in keys}

    def objective(values):
        data = _mean_sq_log_error(runs, with_values(base, values))
        prior = sum(_prior_penalty(k, v, defaults[k]) for k, v in values.items())
        # the prior weighs as one typical (5%) measurement error per constant over all records
        return data + 0.0025 * prior / len(runs)

    values = bounded_fit(keys, defaults, _ALL_BOUNDS, objective, 0.05, ITERATIONS)
    fitted = with_values(base, values)
    before, after = evaluate_rows(runs, base), evaluate_rows(runs, fitted)
    records = tuple({"store": r.run.source_id, "plan": plan_label(r.run.plan),
                     "measured_step_s": r.measured_step_s, "predicted_before_s": r.predicted_step_s,
                     "predicted_after_s": a.predicted_step_s} for r, a in zip(before, after))
    return Calibration(values=values, defaults=defaults, gpu=gpus.pop(), device=device,
                       records=records, before_pct=_mape(before), after_pct=_mape(after),
                       fingerprint=model_fingerprint())


def _mape(rows) -> float:
    return float(np.mean([r.abs_pct_error for r in rows]))


# ---------------------------------------------------------------- file


def write_calibration(path: Path, cal: Calibration) -> Path:
    data = {"kind": KIND, "model_fingerprint": cal.fingerprint, "gpu": cal.gpu,
            "device": cal.device,
            "constants": [{"key": list(k), "value": v, "shipped": cal.defaults[k]}
                          for k, v in cal.values.items()],
            "residuals_pct": {"before": round(cal.before_pct, 3), "after": round(cal.after_pct, 3)},
            "records": [dict(r) for r in cal.records]}
    return write_atomic(Path(path), yaml.safe_dump(data, sort_keys=False))


def read_calibration(path: Path) -> Calibration:
    """A calibration file (InputError naming the file when it is not one)."""
    from autoconfig.textfile import read_text
    text = read_text(path, "calibration file")
    try:
        data = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError(f"not a {KIND} file")
        # every field checked, each constant a fitted one within the fit's bounds
        return Calibration(**file_fields(data, FREE + EXTRA_FREE, _ALL_BOUNDS))
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise InputError(f"invalid calibration file {path}: {str(exc).splitlines()[0]} "
                         "(write one with `autoconfig calibrate`)") from None


def constants_for(path: Path | None, gpu_name: str) -> tuple[PerfConstants | None, str]:
    """(constants, one line saying so) of a calibration file for predictions on
    ``gpu_name``; (None, "") without a file. InputError for another GPU, for a
    CPU-proxy calibration, or for an older model."""
    if path is None:
        return None, ""
    cal = read_calibration(path)
    if cal.device == "cpu":
        raise InputError(f"calibration {path} was fitted on CPU-proxy measurements: they "
                         "never calibrate GPU predictions (profile on GPUs to calibrate)")
    if cal.gpu != gpu_name:
        raise InputError(f"calibration {path} was fitted on {cal.gpu}, not {gpu_name}: "
                         f"calibrate on {gpu_name} measurements")
    if cal.fingerprint != model_fingerprint():
        raise InputError(f"calibration {path} was fitted to another version of the model "
                         "(fingerprint differs): run `autoconfig calibrate` again on its stores")
    moved = ", ".join(f"{'.'.join(k)} {cal.defaults[k]:.4g}->{v:.4g}"
                      for k, v in cal.values.items() if not math.isclose(v, cal.defaults[k]))
    return cal.constants(), (f"calibrated by {path} ({len(cal.records)} measured plans on "
                             f"{cal.gpu}; {moved or 'no constant moved'})")


def calibrated(inputs, path):
    """``inputs`` (training.inputs.SearchInputs) with the constants of the
    calibration file ``path`` for their GPU (unchanged without a file)."""
    import dataclasses
    constants, note = constants_for(path, inputs.cluster.gpu.name)
    return dataclasses.replace(inputs, constants=constants, calibration_note=note)
