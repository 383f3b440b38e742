"""Comparing two sweep runs setting by setting (matched by setting key, never by
row order): throughput change, best-plan change, settings that became
infeasible, settings present in only one run.

A setting regresses when its throughput drops by more than the threshold
(measured tokens/s where both runs measured it, else predicted), or when it
was ``ok`` and no longer is. With ``either_way`` a move beyond the threshold in
either direction counts (for pinning predictions to a committed baseline).
"""

from dataclasses import dataclass

from tabulate import tabulate

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


def compare_runs(old: dict[str, dict], new: dict[str, dict],
                 threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                 either_way: bool = False) -> Comparison:
    """Compare two runs given as key -> record (``summary.load_run``)."""
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
        rows = [["❌" if c.regression else "", c.key, c.kind, _pct_text(c.predicted_change_pct),
                 _pct_text(c.measured_change_pct), c.old_plan or "", c.new_plan or "",
                 c.reason[:80]]
                for c in sorted(shown, key=lambda c: (not c.regression, c.key))]
        lines += [tabulate(rows, headers=("", "setting", "change", "predicted", "measured",
                                          "old best plan", "new best plan", "reason"),
                           tablefmt="github"), ""]
    else:
        lines += ["Every setting matched within the threshold with the same best plan.", ""]
    return "\n".join(lines)


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
