"""Running a sweep: one search (and maybe a profiling run) per setting.

Layout of a run directory:
- ``manifest.json``: autoconfig version, git commit, sha256 of every catalog and
  heuristics file used, the sweep file, date, host (written first);
- ``settings/<setting>.json``: one record per setting, written atomically as
  the setting finishes; a setting with a record is final and is skipped when
  the sweep runs again in the same directory (resume);
- ``profiles/<setting>/profile/``: the profiling store of a profiled setting
  (itself resumable plan by plan);
- ``sweep.csv``, ``sweep.md``, ``sweep.json`` and plots: rebuilt from the
  records at the end (``autoconfig.sweep.summary``).

Settings are independent: one that fails (nothing fits, every profiling job
OOM or timeout, an error) is recorded with its reason and the sweep goes on.
"""

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from contextlib import suppress
from pathlib import Path

from autoconfig import __version__
from autoconfig.atomic import write_atomic
from autoconfig.errors import AutoconfigError, BusyError, InputError
from autoconfig.sweep.spec import Setting, SweepSpec

MANIFEST = "manifest.json"
SETTINGS_DIR = "settings"
PROFILES_DIR = "profiles"
STATUSES = ("ok", "infeasible", "profile_failed", "error")
"""Every status is final: ``ok``; ``infeasible`` (nothing fits, or fp8 on a GPU
without it); ``profile_failed`` (predicted, but no profiled plan ran: OOM,
timeout, error); ``error`` (anything else, with its message)."""


def setting_path(out_dir: Path, setting: Setting) -> Path:
    return Path(out_dir) / SETTINGS_DIR / f"{setting.slug}.json"


def load_record(out_dir: Path, setting: Setting) -> dict | None:
    """The setting's final record, or None (absent or unreadable: run it)."""
    path = setting_path(out_dir, setting)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):   # unreadable, not JSON or not UTF-8: run it again
        return None
    return record if isinstance(record, dict) and record.get("status") in STATUSES else None


FAILED_SETTINGS = ("profile_failed", "error")
"""The setting statuses ``--retry failed`` runs again."""


def run_sweep(spec: SweepSpec, out_dir: Path, sweep_file: Path | None = None, *,
              progress=None, echo=None, retry=(), calibration=None,
              plots: bool = True) -> list[dict]:
    """Run every setting without a final record, and those whose record has a
    status ``retry`` names (``failed``: ``FAILED_SETTINGS``; a profiled setting run again also
    runs its failed plans again); return all records in the sweep's order.
    ``calibration`` (a file of ``autoconfig calibrate``) applies to the settings on
    the GPU it was fitted on; the others use the shipped constants."""
    from autoconfig.profiling.store import lock, retry_statuses
    again = retry_statuses(retry, FAILED_SETTINGS)
    out_dir = Path(out_dir)
    echo = echo or (lambda text: print(text, file=sys.stderr))
    records = []
    # One sweep per run directory at a time (two would run every setting twice
    # and lose a manifest update): the profiling store's lock, judged by pid and
    # process start time.
    with lock(out_dir):
        write_manifest(out_dir, spec, sweep_file, echo)
        for setting in spec.settings:
            record = load_record(out_dir, setting)
            if record is None and setting_path(out_dir, setting).exists():
                echo(f"warning: {setting_path(out_dir, setting)} is not a readable record: "
                     f"{setting.key} runs again")
            if record is None or record.get("status") in again:
                record = run_setting(setting, spec, out_dir,
                                     retry_plans=("failed",) if record is not None else (),
                                     calibration=calibration, plots=plots)
                if record.get("busy"):
                    # Another sweep holds the setting's folder: not an outcome of the
                    # setting, so no record; the next run tries it again.
                    echo(f"{setting.key}: {record['reason']} (not recorded; runs again "
                         "on the next run)")
                else:
                    write_atomic(setting_path(out_dir, setting),
                                 json.dumps(record, indent=2, default=_json) + "\n")
            records.append(record)
            if progress is not None:
                progress.advance(f"{setting.key}: {record['status']}")
    return records


def run_setting(setting: Setting, spec: SweepSpec, out_dir: Path, retry_plans=(),
                calibration=None, plots: bool = True) -> dict:
    """Search one setting (and profile it in profile mode, running plans whose
    final status ``retry_plans`` names again); never raises."""
    started = time.time()
    record = {"key": setting.key, "setting": setting.to_dict(), "status": "error",
              "reason": "", "started_at": _now(started)}
    try:
        result = _search(setting, calibration)
        if result.constants is not None:
            record["calibration"] = str(calibration)
        record.update(_predicted(result), status="ok")
        if setting.mode == "profile":
            record.update(_profile(setting, spec, result, out_dir, retry_plans, plots))
    except BusyError as exc:
        record.update(status="error", reason=str(exc), busy=True)
    except AutoconfigError as exc:
        infeasible = type(exc).__name__ == "InfeasibleError" or "not available on" in str(exc)
        record.update(status="infeasible" if infeasible else "error", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - one setting's failure never stops the sweep
        last = traceback.format_exc().strip().splitlines()[-1]
        record.update(status="error", reason=f"{type(exc).__name__}: {exc} ({last})")
    record["elapsed_s"] = round(time.time() - started, 3)
    record["finished_at"] = _now(time.time())
    return record


def _search(setting: Setting, calibration=None):
    from autoconfig.training.inputs import inputs_from_options
    from autoconfig.training.search import search_inputs
    from autoconfig.training.stack import resolve_software
    shape = dict(setting.model.shape)
    stack, software = resolve_software(setting.stack, **dict(setting.overrides))
    inputs = inputs_from_options(
        stack=stack, software=software, base=None, model=setting.model.model,
        size=setting.model.size, layers=shape.get("layers"), hidden=shape.get("hidden"),
        heads=shape.get("heads"), kv_heads=shape.get("kv_heads"), ffn=shape.get("ffn"),
        vocab=shape.get("vocab"), swiglu=bool(shape.get("swiglu")), gpu=setting.gpu,
        nodes=setting.nodes, gpus_per_node=setting.gpus_per_node, gbs=setting.gbs,
        seq_len=setting.seq_len or shape.get("seq_len"), precision=setting.precision,
        tp=None, pp=None, vp=None, cp=None, mbs=None, recompute=None, sp="auto",
        distributed_optimizer="auto", max_tp_per_node=None, objective=setting.objective,
        top=10, output_dir=None)
    path = _applies(calibration, setting.gpu)
    if path is not None:
        from autoconfig.profiling.calibrate import calibrated
        inputs = calibrated(inputs, path)
    return search_inputs(inputs)


def _applies(calibration, gpu: str):
    """The calibration file when it was fitted on ``gpu``, else None."""
    if calibration is None:
        return None
    from autoconfig.core.catalog import get_gpu
    from autoconfig.profiling.calibrate import read_calibration
    return calibration if read_calibration(calibration).gpu == get_gpu(gpu).name else None


PLAN_KEYS = ("tp", "pp", "vp", "cp", "dp", "sp", "mbs", "recompute", "recompute_method",
             "recompute_num_layers", "distributed_optimizer")
PREDICTED_KEYS = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "memory_gib")


def _row_summary(result, i: int) -> dict:
    from autoconfig.core.plan import plan_label
    row = result.table.iloc[i]
    plan = result.plans.plan(i)
    return {"plan": plan.to_dict(), "label": plan_label(plan),
            "predicted": {k: float(row[k]) for k in PREDICTED_KEYS}}


def _predicted(result) -> dict:
    w, c = result.workload, result.cluster
    return {"model_name": result.model.name, "gpus": c.num_gpus,
            "gpus_per_node": c.gpus_per_node, "global_batch_size": w.global_batch_size,
            "seq_len": w.seq_len, "considered": result.considered, "feasible": result.feasible,
            "dominated": result.dominated,
            "best": _row_summary(result, 0),
            "runner_up": _row_summary(result, 1) if result.feasible > 1 else None}


def _profile(setting: Setting, spec: SweepSpec, result, out_dir: Path, retry_plans=(),
             plots: bool = True) -> dict:
    """Profile the setting's top plans; the measured best (or why none ran)."""
    from autoconfig.profiling.report import build_table
    from autoconfig.errors import ProfilingError
    from autoconfig.profiling.store import PROFILE_SUBDIR
    from autoconfig.profiling.sweep import ProfileOptions, ranked_from_search, run_profiling
    flags = dict(spec.profile)
    flags["retry"] = tuple(flags.get("retry") or ()) + tuple(retry_plans)
    options = ProfileOptions.from_flags(profile=True, **flags)
    where = Path(out_dir) / PROFILES_DIR / setting.slug
    lines = []
    try:
        results_dir = run_profiling(ranked_from_search(result), result.model, result.workload,
                                    result.cluster, options, where,
                                    echo=lambda text="", err=False: lines.append(str(text)),
                                    software=result.software, stack=result.stack,
                                    plots=plots)
    except ProfilingError:   # no plan ran ok: the table below says why
        results_dir = where / PROFILE_SUBDIR
    table = build_table(results_dir, options.profile_objective)
    ok = table[table["status"] == "ok"]
    measured = {"profile_dir": str(Path(results_dir).relative_to(out_dir)),
                "profiled": int(len(table)), "device": options.device}
    if ok.empty:
        reasons = "; ".join(f"{r['plan']}: {r['status']} {r['error']}".strip()
                            for _, r in table.iterrows()) or "no job reported"
        return {"status": "profile_failed", "reason": f"no profiled plan ran ({reasons})",
                "measured": measured}
    best = ok.iloc[0]
    measured.update(label=best["plan"], step_time_s=_f(best["step_time_s"]),
                    tokens_per_s_per_gpu=_f(best["tokens_per_s_per_gpu"]),
                    peak_memory_gib=_f(best["peak_memory_gib"]),
                    predicted_rank=_f(best["predicted_rank"]))
    return {"measured": measured}


def write_manifest(out_dir: Path, spec: SweepSpec, sweep_file: Path | None,
                   echo=None) -> Path:
    """manifest.json: what produced this run (kept from the first invocation;
    each resume is appended to ``resumed``). A folder that holds another sweep
    is refused: its records and the new ones would merge into one report."""
    path = Path(out_dir) / MANIFEST
    manifest = _existing_manifest(path, echo)
    if manifest is not None and manifest.get("sweep_name") not in (None, spec.name):
        raise InputError(f"results folder {out_dir} holds sweep {manifest['sweep_name']!r} "
                         f"({path}), not {spec.name!r}: give another output folder (-o) or "
                         "that sweep's file to resume it")
    if manifest is not None:
        resumed = manifest.get("resumed")
        manifest["resumed"] = (resumed if isinstance(resumed, list) else []) + [_now(time.time())]
    else:
        manifest = {"autoconfig_version": __version__, "git_commit": git_commit(),
                    "sweep_name": spec.name, "sweep_file": str(sweep_file) if sweep_file else None,
                    "created_at": _now(time.time()), "host": socket.gethostname(),
                    "python": platform.python_version(), "argv": sys.argv,
                    "settings": len(spec.settings), "files_sha256": files_used(spec, sweep_file)}
    return write_atomic(path, json.dumps(manifest, indent=2) + "\n")


def _existing_manifest(path: Path, echo=None) -> dict | None:
    """The manifest a first run wrote; None when there is none. A corrupt one is
    set aside (manifest.json.corrupt, said in one line) and a new one written:
    nothing lost."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return data
    except (OSError, ValueError):
        pass
    aside = path.with_name(path.name + ".corrupt")
    with suppress(OSError):
        os.replace(path, aside)
    if echo is not None:
        echo(f"warning: {path} was not a readable manifest: set aside as {aside.name}, "
             "a new one written")
    return None


def files_used(spec: SweepSpec, sweep_file: Path | None) -> dict[str, str]:
    """sha256 of the sweep file, the catalog files of its GPUs and models, the
    heuristics and the stacks it uses (paths relative to the data root)."""
    from autoconfig.paths import configs_dir, data_root, heuristics_dir
    paths = set(heuristics_dir().glob("*.yaml"))
    paths |= {heuristics_dir() / "stacks" / f"{s.stack}.yaml" for s in spec.settings}
    paths |= {configs_dir() / "gpus" / f"{s.gpu}.yaml" for s in spec.settings}
    from autoconfig.core.catalog import get_model, looks_like_path
    for s in spec.settings:
        if s.model.model and looks_like_path(s.model.model):
            paths.add(Path(s.model.model))
        elif s.model.model:
            paths.add(configs_dir() / "models" / f"{get_model(s.model.model, s.model.size).name}.yaml")
    out = {}
    root = data_root()
    for path in sorted(p for p in paths if p.is_file()):
        name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    if sweep_file is not None and Path(sweep_file).is_file():
        out[str(sweep_file)] = hashlib.sha256(Path(sweep_file).read_bytes()).hexdigest()
    return out


def git_commit() -> str | None:
    """The commit of the autoconfig checkout, when it is one and git exists."""
    from autoconfig.paths import data_root
    try:
        out = subprocess.run(["git", "-C", str(data_root()), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _now(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _f(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if out != out else out


def _json(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)
