"""The replay executor: each profiling job is answered from a table of measured
runs (a published topology search, or a user's own earlier measurements)
instead of being run, through the same interface, store and reports.

The table is a CSV file with plan columns (any of ``autoconfig.core.plan``'s
PLAN_FIELDS; at least tp, pp and dp) and the measured ``step_time_s`` or
``tokens_per_s_per_gpu`` (either gives the other through the job's global
batch and sequence); optional ``status`` (default ok), ``peak_memory_bytes``
and ``device`` (default cuda: measured on GPUs). A plan
matches a row when it equals the row on every plan column the table gives; a
plan no row matches is recorded as not measurable (status error), never
guessed.
"""

import csv
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Sequence

from autoconfig.core.plan import PLAN_FIELDS, Plan
from autoconfig.errors import InputError
from autoconfig.profiling.executors import register
from autoconfig.profiling.executors.base import Executor, JobItem, Run
from autoconfig.profiling.spec import STATUSES

NOT_MEASURABLE = "not measurable: no row of the measurements table matches this plan"
REQUIRED = ("tp", "pp", "dp")
MEASURES = ("step_time_s", "tokens_per_s_per_gpu")


@dataclass(frozen=True)
class ReplayOptions:
    """Settings of the replay executor."""

    FLAGS: ClassVar[tuple[str, ...]] = ("measurements",)

    measurements: str | None = None
    """The CSV table of measured runs."""

    @classmethod
    def from_flags(cls, measurements=None) -> "ReplayOptions":
        return cls(measurements=measurements)


@dataclass(frozen=True)
class ReplayJob:
    """A job answered at once: the matched row's record, or why there is none."""

    job_id: str
    record: dict | None


@register
class ReplayExecutor(Executor):
    name = "replay"
    Options = ReplayOptions
    needs_worker = False

    def __init__(self, options) -> None:
        super().__init__(options)
        self._rows: list[dict] | None = None

    @classmethod
    def check_environment(cls, options) -> None:
        """The measurements table is read before the search: a missing or malformed
        file is one line, not a failure after the launch files are written. The
        executor made later reads the same parse (``load_measurements`` keeps it
        while the file is unchanged)."""
        backend = options.backend or ReplayOptions()
        load_measurements(backend.measurements)

    def capacity(self) -> int:
        return 2 ** 31   # nothing runs: any plan the table measured can be answered

    def check_capacity(self, plans: Sequence[Plan]) -> None:
        """Any plan size: the table answers or says it cannot."""

    def preflight(self) -> None:
        self.rows()

    def rows(self) -> list[dict]:
        """The table's rows (InputError naming the file when it is not usable)."""
        if self._rows is None:
            self._rows = load_measurements(self.backend.measurements)
        return self._rows

    def submit(self, runs: list[Run], folder: Path) -> None:
        for index, run in enumerate(runs):
            run.job = ReplayJob(job_id=f"replay-{index}", record=self.lookup(run.item))

    def lookup(self, item: JobItem) -> dict | None:
        plan = item.plan
        for row in self.rows():
            if all(getattr(plan, name) == value for name, value in row["plan"].items()):
                record = {**row["record"], "world_size": item.world_size}
                if record["step_time_s"] and not record["tokens_per_s_per_gpu"]:
                    record["tokens_per_s_per_gpu"] = _tokens_rate(item, record["step_time_s"])
                elif record["tokens_per_s_per_gpu"] and not record["step_time_s"]:
                    step = _tokens_rate(item, record["tokens_per_s_per_gpu"])  # same relation
                    record.update(step_time_s=step, iteration_times_s=[step] if step else [])
                    if step is None:
                        record.update(status="error", error="a tokens/s row needs the job's "
                                      "batch and sequence to give a step time")
                return record
        return None

    def outcome(self, job):
        if job.record is None:
            return ("error", f"{NOT_MEASURABLE} ({self.backend.measurements})")
        return ("success", dict(job.record))

    def finished(self, job) -> bool:
        return True

    def state(self, job) -> str:
        return "COMPLETED"

    def cancel(self, job) -> None:
        """Nothing runs."""

    def dry_run(self, items, folder: Path, echo, label) -> None:
        found = [self.lookup(item) is not None for item in items]
        for item, measured in zip(items, found):
            echo(f"# replay: {label(item.plan)}: {'measured' if measured else 'not measurable'}")
        echo(f"# dry run: {sum(found)} of {len(items)} plan(s) in {self.backend.measurements} "
             f"({len(self.rows())} rows); nothing replayed")


def _tokens_rate(item: JobItem, step_time_s: float) -> float | None:
    """Tokens/s/GPU of a step time (or the step time of a tokens/s/GPU: the same
    relation) from the job's ProfileSpec (its global batch and sequence); None
    when the job is not a profiling job."""
    from autoconfig.profiling.spec import ProfileSpec
    try:
        spec = ProfileSpec.from_json(item.args[0])
    except (IndexError, TypeError, ValueError, KeyError):
        return None
    return spec.workload.tokens_per_step / (item.world_size * step_time_s)


def load_measurements(path) -> list[dict]:
    """[{"plan": {field: value}, "record": {...}}] of a measurements CSV, parsed
    once while the file is unchanged (the up-front check and the executor share
    the parse); each call gets its own copy of the rows."""
    if not path:
        raise InputError("--executor replay needs --measurements FILE.csv (plan columns and "
                         "step_time_s)")
    try:
        stat = Path(path).stat()
    except OSError:
        return _parse_measurements(path)    # read_text names the fault
    rows = _parsed(str(path), str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    return [{"plan": dict(r["plan"]), "record": dict(r["record"])} for r in rows]


@lru_cache(maxsize=1)
def _parsed(path: str, resolved: str, size: int, mtime_ns: int) -> tuple:
    """The rows of ``path`` (named as given) while the file at ``resolved`` has
    this size and modification time: the cache key."""
    return tuple(_parse_measurements(path))


def _parse_measurements(path) -> list[dict]:
    from autoconfig.textfile import read_text
    text = read_text(Path(path), "measurements file")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in columns]
    if not any(m in columns for m in MEASURES):
        missing.append(" or ".join(MEASURES))
    if missing:
        raise InputError(f"measurements file {path}: missing column(s) {', '.join(missing)}")
    plan_columns = [c for c in columns if c in PLAN_FIELDS]
    defaults = Plan(tp=1, pp=1, dp=1)
    rows = []
    for number, row in enumerate(reader, start=2):
        try:
            plan = {c: _typed(getattr(defaults, c), row[c]) for c in plan_columns
                    if (row.get(c) or "").strip()}
            record = _record(row)
        except ValueError as exc:
            raise InputError(f"measurements file {path} line {number}: {exc}") from None
        rows.append({"plan": plan, "record": record})
    return rows


def _typed(default, text: str):
    text = text.strip()
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"not a true/false value: {text[:40]!r}")
        return text.lower() in ("true", "1", "yes")
    if isinstance(default, int):
        return int(text)
    return text


def _record(row: dict) -> dict:
    status = (row.get("status") or "ok").strip()
    if status not in STATUSES:
        raise ValueError(f"unknown status {status[:40]!r}: allowed are {', '.join(STATUSES)}")
    step = _positive(row.get("step_time_s"), "step_time_s") if status == "ok" else None
    rate = _positive(row.get("tokens_per_s_per_gpu"), "tokens_per_s_per_gpu")
    if status == "ok" and step is None and rate is None:
        raise ValueError("an ok row needs step_time_s or tokens_per_s_per_gpu")
    record = {"status": status, "device": (row.get("device") or "cuda").strip(),
              "step_time_s": step, "iteration_times_s": [step] if step else [],
              "tokens_per_s_per_gpu": rate,
              "peak_memory_bytes": _positive(row.get("peak_memory_bytes"), "peak_memory_bytes"),
              "losses": [], "error": "" if status == "ok" else f"replayed {status}",
              "run_notes": "replayed from a measurements table"}
    return record


def _positive(text, name: str) -> float | None:
    if text is None or not str(text).strip():
        return None
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} {str(text)[:40]} is not a positive number")
    return value
