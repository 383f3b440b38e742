"""The leave-one-source-out figures, computed once and kept with a fingerprint.

Cross-validation refits the constants once per source (minutes on 2 cores), so
``autoconfig validate --cross-validate`` computes it and writes
``benchmarks/cross_validation.json`` together with a fingerprint of everything
the figures depend on (the runs and their settings, heuristics, GPU catalog and
the model's source code). ``validate`` prints the stored figures only while the
fingerprint still matches; otherwise it says they are out of date, and
``--check`` fails. tests/test_validation.py checks that the committed file is
current, so a change to the model cannot land without its cross-validated figures.
"""

import hashlib
import json
from pathlib import Path

from autoconfig.atomic import write_atomic
from autoconfig.paths import benchmarks_dir, configs_dir, heuristics_dir

_PACKAGE = Path(__file__).resolve().parent.parent
MODEL_SOURCES = ("core/comm.py", "core/model.py", "core/plan.py", "core/hardware.py",
                 "core/catalog.py", "training/step_time.py", "training/stack.py",
                 "training/activations.py", "training/memory.py", "training/moe_overlap.py",
                 "training/fp8.py", "training/context_parallel.py", "training/offload.py",
                 "validation/runs.py", "validation/scoring.py",
                 "validation/calibration.py")


def store_path() -> Path:
    return benchmarks_dir() / "cross_validation.json"


def _model_files() -> list[Path]:
    """The step-time model: its code, constants, stacks, GPU and model catalogs."""
    return [heuristics_dir() / "perf.yaml", heuristics_dir() / "fp8.yaml",
            *sorted((heuristics_dir() / "stacks").glob("*.yaml")),
            *sorted((configs_dir() / "gpus").glob("*.yaml")),
            # rows may name catalog models (the MoE runs)
            *sorted((configs_dir() / "models").glob("*.yaml")),
            *(_PACKAGE / name for name in MODEL_SOURCES)]


def _digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes() if path.is_file() else b"missing")
    return digest.hexdigest()


def fingerprint() -> str:
    """sha256 over the inputs of the step-time model and its validation."""
    return _digest([benchmarks_dir() / "published_runs.csv",
                    benchmarks_dir() / "run_settings.yaml", *_model_files()])


def model_fingerprint() -> str:
    """sha256 over the step-time model alone (what a calibration file was fitted
    to; the published runs are not part of it)."""
    return _digest(_model_files())


def save(cv, spearman_weighted: float, seconds: float) -> Path:
    data = {"fingerprint": fingerprint(), "fitted_constants": cv.fitted_constants,
            "in_sample_pct": cv.in_sample_pct, "held_out_pct": cv.held_out_pct,
            "rows": cv.rows, "held_out_overall_pct": cv.held_out_overall_pct,
            "in_sample_overall_pct": cv.in_sample_overall_pct,
            "held_out_spearman_weighted": spearman_weighted, "seconds": round(seconds, 1),
            "held_out_predictions": cv.held_out_predictions}
    write_atomic(store_path(), json.dumps(data, indent=1, sort_keys=True) + "\n")
    return store_path()


def load_current() -> tuple[dict | None, str]:
    """(stored figures, '') when current, else (None, why not)."""
    path = store_path()
    if not path.is_file():
        return None, f"{path} is missing"
    data = json.loads(path.read_text())
    if data.get("fingerprint") != fingerprint():
        return None, (f"{path.name} is out of date: the model or its inputs changed since it "
                      "was computed")
    return data, ""
