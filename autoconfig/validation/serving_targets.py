"""The serving model's headline targets, scored on ``infer-validate``'s result:
per engine with at least ``TARGET_MIN_POINTS`` points of a metric, TTFT and
throughput MAPE <= 15% and latency <= 12% (the inference realism issue's "done
when"), and the seed points' published order by throughput per GPU. Rows in the
form of ``autoconfig.validation.scoring.targets``, printed by its
``format_targets``."""

from autoconfig.inference.published import ValidationResult, metric_figures
from autoconfig.validation.scoring import Target

TARGET_PCT = {"ttft": 15.0, "latency": 12.0, "throughput": 15.0}
"""Per-engine MAPE targets by metric."""
TARGET_MIN_POINTS = 10
"""Points of a metric an engine needs before its figure is held to the target."""


def serving_targets(result: ValidationResult) -> list[tuple[str, float, Target, bool]]:
    """(name, value, target, met) per engine and targeted metric with enough
    points, and the seed points' order (none where nothing was asked)."""
    rows = []
    for engine, metric, points, mape, _ in metric_figures(result.table):
        if metric in TARGET_PCT and points >= TARGET_MIN_POINTS:
            target = Target("<=", TARGET_PCT[metric])
            rows.append((f"{metric} MAPE {engine} ({points} points)", mape, target,
                         target.met(mape)))
    if result.seed_order_holds is not None:
        held = 1.0 if result.seed_order_holds else 0.0
        rows.append(("seed points' order by throughput per GPU holds (1 = yes)", held,
                     Target(">=", 1.0, percent=False), bool(result.seed_order_holds)))
    return rows
