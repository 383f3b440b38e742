"""The sweep file: a matrix of settings, validated into Setting values.

```yaml
name: nightly                 # optional, shown in reports
matrix:                       # every combination of these lists is one setting
  model: [llama3-8b, {model: gpt3, size: 175b},
          {name: my-shape, layers: 4, hidden: 256, heads: 4, vocab: 1024}]
  gpu: [h100, a100-80gb]
  nodes: [16, 64]
  gbs: [auto]                 # sequences; auto = the base heuristic
  seq_len: [auto]             # auto = the model's
  precision: [bf16]
  stack: [megatron-lm]
  overrides: [{}]             # single-feature overrides of the stack, as the CLI's
                              # options: {fp8_recipe: mxfp8, tp_comm_overlap: false}
  objective: [throughput]
  mode: [predict]             # predict, or profile (short real runs)
settings: []                  # optional extra settings, each a mapping of the keys above
gpus_per_node: auto           # optional, for every setting
tokens: 1t                    # optional token budget: sweep.csv then gives train_days
profile: {device: cpu, executor: local, top_k: 2, max_steps: 2, warmup_steps: 1}
```

Every error is one line naming the bad key or value and what is allowed.
"""

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autoconfig.textfile import read_text
from autoconfig.yamlio import SAFE_LOADER

from autoconfig.core.plan import PRECISIONS
from autoconfig.errors import MAX_COUNT, MAX_SEQ_LEN, InputError, shown

MODES = ("predict", "profile")
OBJECTIVES = ("throughput", "memory")
AXES = ("model", "gpu", "nodes", "gbs", "seq_len", "precision", "stack", "overrides",
        "objective", "mode")
DEFAULTS = {"gbs": "auto", "seq_len": "auto", "precision": "bf16", "stack": "megatron-lm",
            "overrides": {}, "objective": "throughput", "mode": "predict"}
TOP_KEYS = ("name", "description", "matrix", "settings", "gpus_per_node", "profile", "tokens")
INLINE_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "swiglu",
               "seq_len")
INLINE_COUNTS = {"layers": MAX_COUNT, "hidden": MAX_COUNT, "heads": MAX_COUNT,
                 "kv_heads": MAX_COUNT, "ffn": MAX_COUNT, "vocab": MAX_COUNT,
                 "seq_len": MAX_SEQ_LEN}
"""The inline shape's integer keys and their largest value (as the CLI's flags)."""
INLINE_FLAGS = ("swiglu",)
"""The inline shape's switches: a YAML true or false, never a string or number."""
NUMBER_OVERRIDES = ("moe_imbalance", "moe_capacity_factor")
"""The stack overrides that take a number; the switches take a bool, the whole-number
ones (``WHOLE_OVERRIDES``) an int, the rest a name."""
WHOLE_OVERRIDES = ("cpu_offload_layers",)
"""The stack overrides that take a whole number (kept an int in the setting's key)."""
PROFILE_KEYS = {"device": str, "executor": str, "top_k": int, "max_steps": int,
                "warmup_steps": int, "max_minutes": int, "max_parallel": int,
                "partition": str, "account": str, "qos": str, "time_limit": int,
                "profile_objective": str, "max_runs": int, "tolerance": float,
                "measurements": str}
PROFILE_POSITIVE = ("top_k", "max_steps", "max_minutes", "max_parallel", "time_limit",
                    "max_runs")
"""Profile counts that must be at least 1 (as ProfileOptions checks the CLI's);
warmup_steps may be 0."""


@dataclass(frozen=True)
class ModelRef:
    """A catalog model (``model``, optional ``size``) or an inline shape."""

    model: str | None = None
    size: str | None = None
    shape: tuple[tuple[str, object], ...] = ()
    """Inline shape as sorted (key, value) pairs (layers, hidden, heads, vocab...)."""

    @property
    def label(self) -> str:
        if self.model:
            return f"{self.model}-{self.size}" if self.size else self.model
        shape = dict(self.shape)
        return str(shape.get("name") or f"custom-{shape['layers']}l-{shape['hidden']}h")


@dataclass(frozen=True)
class Setting:
    """One point of the matrix: what to search (and maybe profile)."""

    model: ModelRef
    gpu: str
    nodes: int
    gbs: int | None
    """None: the base heuristic."""
    seq_len: int | None
    """None: the model's."""
    precision: str = "bf16"
    stack: str = "megatron-lm"
    objective: str = "throughput"
    mode: str = "predict"
    gpus_per_node: int | None = None
    overrides: tuple[tuple[str, object], ...] = ()
    """The stack's single-feature overrides (``training.stack.OVERRIDES``) as sorted
    (name, value) pairs."""

    @property
    def key(self) -> str:
        """The setting's identity across runs (compare matches on it); a setting
        without overrides keeps the key it had before sweeps took them."""
        stack = self.stack + "".join(f"+{name}={_text(value)}"
                                     for name, value in self.overrides)
        return (f"{self.model.label}|{self.gpu}|{self.nodes}n"
                + (f"x{self.gpus_per_node}" if self.gpus_per_node else "")
                + f"|gbs={self.gbs or 'auto'}|seq={self.seq_len or 'auto'}|{self.precision}"
                f"|{stack}|{self.objective}|{self.mode}")

    @property
    def slug(self) -> str:
        """A file-name-safe form of the key (for the per-setting result file)."""
        return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in self.key)

    def to_dict(self) -> dict:
        return {"model": self.model.label, "model_ref": {"model": self.model.model,
                                                         "size": self.model.size,
                                                         "shape": dict(self.model.shape)},
                "gpu": self.gpu, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "gbs": self.gbs, "seq_len": self.seq_len, "precision": self.precision,
                "stack": self.stack, "overrides": dict(self.overrides),
                "objective": self.objective, "mode": self.mode}


@dataclass(frozen=True)
class SweepSpec:
    name: str
    settings: tuple[Setting, ...]
    profile: dict = field(default_factory=dict)
    """Profiling options (ProfileOptions field names) for settings in profile mode."""
    tokens: float | None = None
    """Optional token budget: reports then give days to train it."""


def load_sweep(path: Path) -> SweepSpec:
    """Read and validate a sweep file."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"sweep file {str(path)!r} not found")
    text = read_text(path, "sweep file")
    try:
        data = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_sweep(data, where=str(path), default_name=path.stem)


def parse_sweep(data, where: str = "sweep", default_name: str = "sweep") -> SweepSpec:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping with 'matrix' and/or 'settings'")
    _unknown(data, TOP_KEYS, where, "top-level key")
    if "matrix" not in data and "settings" not in data:
        raise InputError(f"{where}: no settings: give 'matrix' (lists per key) and/or "
                         "'settings' (a list of mappings)")
    gpn = _opt_int(data.get("gpus_per_node"), f"{where}: gpus_per_node")
    settings: list[Setting] = []
    if data.get("matrix") is not None:
        settings += _matrix(data["matrix"], f"{where}: matrix", gpn)
    extra = data.get("settings") or []
    if not isinstance(extra, list):
        raise InputError(f"{where}: settings must be a list of mappings, got {extra!r}")
    for i, item in enumerate(extra):
        item_where = f"{where}: settings[{i}]"
        if not isinstance(item, dict):
            raise InputError(f"{item_where}: expected a mapping of {', '.join(AXES)}")
        _unknown(item, AXES + ("gpus_per_node",), item_where, "key")
        values = {**DEFAULTS, **item}
        settings.append(_setting(values, item_where,
                                 _opt_int(item.get("gpus_per_node", gpn),
                                          f"{item_where}: gpus_per_node")))
    keys = [s.key for s in settings]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise InputError(f"{where}: setting {dupes[0]!r} appears twice")
    if not settings:
        raise InputError(f"{where}: the matrix and settings give no setting")
    profile = _profile(data.get("profile") or {}, f"{where}: profile")
    tokens = None
    if data.get("tokens") is not None:
        from autoconfig.units import parse_count
        try:
            tokens = parse_count(str(data["tokens"]), what="tokens")
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    return SweepSpec(name=str(data.get("name") or default_name), settings=tuple(settings),
                     profile=profile, tokens=tokens)


def _matrix(matrix, where: str, gpn: int | None) -> list[Setting]:
    if not isinstance(matrix, dict):
        raise InputError(f"{where}: expected a mapping of {', '.join(AXES)} to lists")
    _unknown(matrix, AXES, where, "key")
    for key in ("model", "gpu", "nodes"):
        if key not in matrix:
            raise InputError(f"{where}: missing {key!r} (a list)")
    lists = {}
    for key in AXES:
        value = matrix.get(key, DEFAULTS.get(key))
        lists[key] = value if isinstance(value, list) else [value]
        if not lists[key]:
            raise InputError(f"{where}: {key} is an empty list")
    return [_setting(dict(zip(AXES, combo)), where, gpn)
            for combo in itertools.product(*(lists[k] for k in AXES))]


def _setting(values: dict, where: str, gpn: int | None) -> Setting:
    for key in ("model", "gpu", "nodes"):
        if values.get(key) is None:
            raise InputError(f"{where}: missing {key!r}")
    nodes = values["nodes"]
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_COUNT:
        raise InputError(f"{where}: invalid nodes {shown(nodes)}: must be a positive integer "
                         f"up to {MAX_COUNT}")
    for key, allowed in (("precision", PRECISIONS), ("objective", OBJECTIVES), ("mode", MODES)):
        if values[key] not in allowed:
            raise InputError(f"{where}: invalid {key} {values[key]!r}: allowed are "
                             f"{', '.join(allowed)}")
    stack = str(values["stack"])
    from autoconfig.training.stack import check_profilable, resolve_software, stack_names
    if stack not in stack_names():
        raise InputError(f"{where}: invalid stack {stack!r}: allowed are "
                         f"{', '.join(stack_names())}")
    overrides = _overrides(values.get("overrides"), f"{where}: overrides")
    try:
        _, features = resolve_software(stack, **dict(overrides))
    except InputError as exc:
        raise InputError(f"{where}: overrides: {exc}") from None
    if values["mode"] == "profile":
        check_profilable(features, stack, "use stack megatron-lm or nemo, or mode predict",
                         f"{where}: ")
    gpu = _gpu_name(values["gpu"], where)
    _check_gpus(gpu, nodes, gpn, where)
    return Setting(model=_model_ref(values["model"], where), gpu=gpu, nodes=nodes,
                   gbs=_auto_int(values["gbs"], f"{where}: gbs"),
                   seq_len=_auto_int(values["seq_len"], f"{where}: seq_len", MAX_SEQ_LEN),
                   precision=values["precision"], stack=stack, objective=values["objective"],
                   mode=values["mode"], gpus_per_node=gpn, overrides=overrides)


def _overrides(value, where: str) -> tuple[tuple[str, object], ...]:
    """A mapping of the stack's single-feature overrides, checked for name and
    type here and for value against the stack by ``resolve_software``."""
    from autoconfig.training.stack import OVERRIDES, SWITCH_OVERRIDES
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a mapping of override names to values, "
                         f"got {value!r}")
    _unknown(value, OVERRIDES, where, "override")
    for name, item in value.items():
        if name in SWITCH_OVERRIDES:
            ok, kind = isinstance(item, bool), "true or false"
        elif name in NUMBER_OVERRIDES:
            ok, kind = isinstance(item, (int, float)) and not isinstance(item, bool), "a number"
        elif name in WHOLE_OVERRIDES:
            ok, kind = isinstance(item, int) and not isinstance(item, bool), "a whole number"
        else:
            ok, kind = isinstance(item, str), "a name"
        if not ok:
            raise InputError(f"{where}: invalid {name} {item!r}: must be {kind}")
    try:
        return tuple(sorted((name, _canonical(name, item)) for name, item in value.items()))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _canonical(name: str, value):
    """One spelling per override value, so that a setting has one key: numbers as
    floats, an FP8 recipe by its canonical name (``current`` is ``tensorwise``)."""
    if name in NUMBER_OVERRIDES:
        return float(value)
    if name == "fp8_recipe":
        from autoconfig.training.fp8 import recipe_name
        return recipe_name(value)
    return value


def _text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def overrides_text(overrides) -> str:
    """The overrides (a mapping, or None) as the CLI options that set them."""
    return " ".join(_flag(name, value) for name, value in sorted((overrides or {}).items()))


def _flag(name: str, value) -> str:
    """The CLI option an override stands for (``--no-tp-comm-overlap``)."""
    option = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{option}" if value else f"--no-{option}"
    return f"--{option} {_text(value)}"


def _gpu_name(value, where: str) -> str:
    from autoconfig.core.catalog import get_gpu
    try:
        return get_gpu(str(value)).name
    except InputError as exc:
        raise InputError(f"{where}: gpu: {exc}") from None


def _check_gpus(gpu: str, nodes: int, gpn: int | None, where: str) -> None:
    """The setting's cluster is one the CLI's could be (``core.hardware.Cluster``
    decides), named in the sweep file's keys."""
    from autoconfig.core.catalog import get_gpu
    from autoconfig.core.hardware import Cluster
    spec = get_gpu(gpu)
    per_node = gpn or spec.gpus_per_node
    try:
        Cluster(gpu=spec, nodes=nodes, gpus_per_node=per_node)
    except InputError:
        raise InputError(f"{where}: invalid nodes {nodes} x gpus_per_node {per_node}: "
                         f"at most {MAX_COUNT} GPUs") from None


def _model_ref(value, where: str) -> ModelRef:
    """A name (``llama3-8b``), {model, size}, or an inline shape mapping; checked
    against the catalog now so a typo fails before anything runs."""
    from autoconfig.core.catalog import get_model, resolve_model
    if isinstance(value, dict):
        allowed = ("model", "size") if "model" in value else INLINE_KEYS
        for key in value:
            if key not in allowed:
                raise InputError(f"{where}: model: unknown key {key!r}: allowed are model and "
                                 f"size (a catalog model) or {', '.join(INLINE_KEYS)} (an "
                                 "inline shape)")
        if "model" not in value:
            _inline_shape(value, f"{where}: model")
    try:
        if isinstance(value, str):
            get_model(value)
            return ModelRef(model=value)
        if isinstance(value, dict) and "model" in value:
            size = None if value.get("size") is None else str(value["size"])
            get_model(str(value["model"]), size)
            return ModelRef(model=str(value["model"]), size=size)
        if isinstance(value, dict):
            resolve_model(None, None, value.get("layers"), value.get("hidden"),
                          value.get("heads"), value.get("kv_heads"), value.get("ffn"),
                          value.get("vocab"), value.get("swiglu", False), value.get("seq_len"))
            return ModelRef(shape=tuple(sorted(value.items())))
    except InputError as exc:
        raise InputError(f"{where}: model: {exc}") from None
    raise InputError(f"{where}: invalid model {value!r}: expected a catalog name, "
                     "{model: NAME, size: SIZE} or an inline shape {layers, hidden, heads, vocab}")


def _inline_shape(value: dict, where: str) -> None:
    """The inline shape's values, each named by the key the user wrote: counts
    are integers from 1 to their bound, switches true or false."""
    for key, item in value.items():
        if key in INLINE_COUNTS:
            high = INLINE_COUNTS[key]
            if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= high:
                raise InputError(f"{where}: invalid {key} {shown(item)}: must be a positive "
                                 f"integer up to {high}")
        elif key in INLINE_FLAGS and not isinstance(item, bool):
            raise InputError(f"{where}: invalid {key} {shown(item)}: must be true or false")


def _profile(data, where: str) -> dict:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of {', '.join(PROFILE_KEYS)}")
    _unknown(data, tuple(PROFILE_KEYS), where, "key")
    out = {}
    for key, value in data.items():
        kind = PROFILE_KEYS[key]
        if kind is int:
            low = 1 if key in PROFILE_POSITIVE else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                what = "a positive integer" if low else "a non-negative integer"
                raise InputError(f"{where}: invalid {key} {shown(value)}: must be {what}")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 <= value < 1):
            raise InputError(f"{where}: invalid {key} {shown(value)}: must be a fraction from 0 to "
                             "below 1")
        out[key] = kind(value)
    from autoconfig.profiling import executors
    from autoconfig.profiling.rank import OBJECTIVES as PROFILE_OBJECTIVES
    from autoconfig.profiling.spec import DEVICES
    for key, allowed in (("device", DEVICES), ("executor", executors.names()),
                         ("profile_objective", PROFILE_OBJECTIVES)):
        if key in out and out[key] not in allowed:
            raise InputError(f"{where}: invalid {key} {shown(out[key])}: allowed are "
                             f"{', '.join(allowed)}")
    if out.get("executor") == "replay":
        from autoconfig.profiling.executors.replay import load_measurements
        try:
            load_measurements(out.get("measurements"))
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    return out


def _unknown(data: dict, allowed: tuple, where: str, what: str) -> None:
    for key in data:
        if key not in allowed:
            raise InputError(f"{where}: unknown {what} {key!r}: allowed are {', '.join(allowed)}")


def _auto_int(value, where: str, high: int = MAX_COUNT) -> int | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InputError(f"{where}: invalid value {shown(value)}: a positive integer up to "
                         f"{high}, or auto")
    return value


def _opt_int(value, where: str) -> int | None:
    return _auto_int(value, where)
