"""Comparing two sweep runs setting by setting (matched by setting key, never by
row order): throughput change, best-plan change, settings that became
infeasible, settings present in only one run.

A setting regresses when its throughput drops by more than the threshold
(measured tokens/s where both runs measured it, else predicted), or when it
was ``ok`` and no longer is. With ``either_way`` a move beyond the threshold in
either direction counts (for pinning predictions to a committed baseline).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from autoconfig.bounds import NON_NEGATIVE, check_number
from autoconfig.errors import InputError, shown

DEFAULT_THRESHOLD_PCT = 5.0


@dataclass(frozen=True)
class SettingChange:
    key: str
    kind: str
    """regressed, improved, unchanged, became infeasible, became feasible,
    still failing, only in old, only in new."""
    regression: bool
    old_status: str | None = None
    new_status: str | None = None
    basis: str | None = None
    """measured or predicted: what the change was judged on."""
    old_tokens: float | None = None
    new_tokens: float | None = None
    change_pct: float | None = None
    predicted_change_pct: float | None = None
    measured_change_pct: float | None = None
    old_plan: str | None = None
    new_plan: str | None = None
    reason: str = ""

    @property
    def plan_changed(self) -> bool:
        return bool(self.old_plan and self.new_plan and self.old_plan != self.new_plan)


@dataclass(frozen=True)
class Comparison:
    changes: tuple[SettingChange, ...]
    threshold_pct: float
    either_way: bool = False

    @property
    def regressions(self) -> tuple[SettingChange, ...]:
        return tuple(c for c in self.changes if c.regression)

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.changes)


def load_run(run_dir: Path) -> dict[str, dict]:
    """key -> record of a sweep run directory: its per-setting records (the
    latest truth), else its sweep.json. Strict: a settings/*.json file that is
    not a readable record, or a record whose compared fields have the wrong
    type, is an InputError naming the file. Skipping it would count the setting
    as "only in old" and hide a regression."""
    from autoconfig.sweep.run import SETTINGS_DIR
    from autoconfig.sweep.summary import JSON_NAME

    run_dir = Path(run_dir)
    paths = sorted((run_dir / SETTINGS_DIR).glob("*.json"))
    if paths:
        return {record["key"]: record for record in map(_read_record, paths)}
    path = run_dir / JSON_NAME
    settings = None
    if path.is_file():
        try:
            settings = json.loads(path.read_text()).get("settings")
        except (OSError, ValueError, AttributeError):   # unreadable, not JSON, not an object
            pass
        if not isinstance(settings, list):
            raise InputError(f"{path}: corrupt (no 'settings' list); rerun the sweep into this "
                             "folder to rebuild it")
    records = {r["key"]: r for r in settings or ()
               if isinstance(r, dict) and isinstance(r.get("key"), str)}
    if not records:
        raise InputError(f"{run_dir}: not a sweep run directory (no {SETTINGS_DIR}/*.json or "
                         f"{JSON_NAME})")
    for key, record in records.items():
        problem = record_problem(record)
        if problem:
            raise _corrupt(path, f"setting {key!r}: {problem}")
    return records


def _read_record(path: Path) -> dict:
    """One settings/*.json record; InputError naming the file when it is not one."""
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise _corrupt(path, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:   # truncated or garbage
        raise _corrupt(path, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise _corrupt(path, "JSON nested too deep") from None
    if not isinstance(record, dict) or not isinstance(record.get("key"), str):
        raise _corrupt(path, "not an object with a 'key' string")
    problem = record_problem(record)
    if problem:
        raise _corrupt(path, problem)
    return record


def _corrupt(path: Path, problem: str) -> InputError:
    return InputError(f"{path}: corrupt setting record ({problem}); move it aside and run "
                      "the sweep again with --resume to rewrite it")


def record_problem(record: dict) -> str:
    """Which compared field of a record has the wrong type ('' when none)."""
    if not isinstance(record.get("status"), str):
        return f"field 'status' {_shown(record.get('status'))} is not a string"
    best, measured = record.get("best"), record.get("measured")
    if best is not None and not isinstance(best, dict):
        return f"field 'best' {_shown(best)} is not an object"
    if measured is not None and not isinstance(measured, dict):
        return f"field 'measured' {_shown(measured)} is not an object"
    if best:
        if not isinstance(best.get("predicted"), dict):
            return f"field 'best.predicted' {_shown(best.get('predicted'))} is not an object"
        predicted = best["predicted"].get("tokens_per_s_per_gpu")
        if not _number_or_none(predicted) or (predicted is None and record["status"] == "ok"):
            return (f"field 'best.predicted.tokens_per_s_per_gpu' {_shown(predicted)} is not "
                    "a finite number")
        if not isinstance(best.get("label"), (str, type(None))):
            return f"field 'best.label' {_shown(best.get('label'))} is not a string"
    if measured and not _number_or_none(measured.get("tokens_per_s_per_gpu")):
        return (f"field 'measured.tokens_per_s_per_gpu' "
                f"{_shown(measured.get('tokens_per_s_per_gpu'))} is not a finite number")
    return ""


def _number_or_none(value) -> bool:
    # The sweep writes finite figures: a NaN compares as unchanged and an infinity as
    # an endless improvement, so either means the record was damaged.
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value))


def _shown(value) -> str:
    return shown(value) if isinstance(value, str) else shown(json.dumps(value))


def compare_runs(old: dict[str, dict], new: dict[str, dict],
                 threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                 either_way: bool = False) -> Comparison:
    """Compare two runs given as key -> record (``load_run``); a threshold of NaN
    or infinity would pass anything and is refused."""
    check_number("--threshold", threshold_pct, NON_NEGATIVE)
    changes = []
    for key in list(old) + [k for k in new if k not in old]:
        if key not in new:
            changes.append(SettingChange(key, "only in old", False,
                                         old_status=old[key].get("status")))
        elif key not in old:
            changes.append(SettingChange(key, "only in new", False,
                                         new_status=new[key].get("status")))
        else:
            changes.append(_change(key, old[key], new[key], threshold_pct, either_way))
    return Comparison(tuple(changes), threshold_pct, either_way)


def _change(key: str, old: dict, new: dict, threshold: float, either_way: bool) -> SettingChange:
    os_, ns = old.get("status"), new.get("status")
    common = dict(old_status=os_, new_status=ns, old_plan=_label(old), new_plan=_label(new))
    if os_ == "ok" and ns != "ok":
        kind = "became infeasible" if ns == "infeasible" else f"now {ns}"
        return SettingChange(key, kind, True, reason=_short(new.get("reason")), **common)
    if os_ != "ok" and ns == "ok":
        return SettingChange(key, "became feasible", either_way, **common)
    if os_ != "ok":
        return SettingChange(key, "still failing", False, reason=_short(new.get("reason")),
                             **common)
    pred = (_predicted(old), _predicted(new))
    meas = (_measured(old), _measured(new))
    pred_pct, meas_pct = _pct(*pred), _pct(*meas)
    basis, (a, b), pct = (("measured", meas, meas_pct) if meas_pct is not None
                          else ("predicted", pred, pred_pct))
    if pct is None:
        kind, bad = "unchanged", False
    elif pct < -threshold:
        kind, bad = "regressed", True
    elif pct > threshold:
        kind, bad = "improved", either_way
    else:
        kind, bad = "unchanged", False
    return SettingChange(key, kind, bad, basis=basis, old_tokens=a, new_tokens=b,
                         change_pct=pct, predicted_change_pct=pred_pct,
                         measured_change_pct=meas_pct, **common)


def render_markdown(cmp: Comparison, old_name: str, new_name: str) -> str:
    """A summary fit for a CI job summary ($GITHUB_STEP_SUMMARY)."""
    regressed = cmp.regressions
    verdict = (f"**{len(regressed)} regression(s)** beyond {cmp.threshold_pct:g}%"
               if regressed else f"no regression beyond {cmp.threshold_pct:g}%")
    rule = ("a move either way" if cmp.either_way else "a throughput drop")
    lines = [f"# Sweep comparison: {old_name} -> {new_name}", "",
             f"{verdict} ({rule} beyond the threshold, on measured tokens/s/GPU where both "
             "runs measured it, else predicted; or a setting that stopped fitting).", "",
             f"- settings compared: {len(cmp.changes)}; " + ", ".join(
                 f"{kind}: {cmp.count(kind)}" for kind in
                 ("regressed", "improved", "unchanged", "became infeasible", "became feasible",
                  "still failing", "only in old", "only in new") if cmp.count(kind)),
             f"- best plan changed: {sum(c.plan_changed for c in cmp.changes)}", ""]
    shown = [c for c in cmp.changes if c.regression or c.kind != "unchanged" or c.plan_changed]
    if shown:
        rows = [["❌" if c.regression else "", _cell(c.key), c.kind,
                 _pct_text(c.predicted_change_pct), _pct_text(c.measured_change_pct),
                 _cell(c.old_plan or ""), _cell(c.new_plan or ""), _cell(c.reason[:80])]
                for c in sorted(shown, key=lambda c: (not c.regression, c.key))]
        lines += [tabulate(rows, headers=("", "setting", "change", "predicted", "measured",
                                          "old best plan", "new best plan", "reason"),
                           tablefmt="github"), ""]
    else:
        lines += ["Every setting matched within the threshold with the same best plan.", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a '|' (setting keys join their parts with
    it) would end the cell."""
    return text.replace("|", "\\|")


def _label(record: dict) -> str | None:
    best = record.get("best")
    return best.get("label") if best else None


def _predicted(record: dict) -> float | None:
    best = record.get("best")
    return best["predicted"]["tokens_per_s_per_gpu"] if best else None


def _measured(record: dict) -> float | None:
    return (record.get("measured") or {}).get("tokens_per_s_per_gpu")


def _pct(old: float | None, new: float | None) -> float | None:
    if old is None or new is None or old == 0:
        return None
    return 100.0 * (new - old) / old


def _pct_text(value: float | None) -> str:
    return "" if value is None else f"{value:+.2f}%"


def _short(text) -> str:
    return " ".join(str(text or "").split())
