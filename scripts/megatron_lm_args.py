"""Record Megatron-LM's pretrain_gpt.py argument parser as test data.

    python scripts/megatron_lm_args.py GIT_DIR [REF] > tests/data/megatron_lm_args.json

GIT_DIR is a clone (or bare git dir) of github.com/NVIDIA/Megatron-LM; REF is the
tag or commit to read (default ``core_v<installed megatron-core version>``, so the
dataclass-generated groups below match the installed megatron-core). Needs
megatron-core installed (TransformerConfig and friends generate part of the parser).

Two readings of the same file, cross-checked:
1. ``ast``: every ``add_argument('--flag', ...)`` literally in
   megatron/training/arguments.py (with literal type/choices/nargs/action).
2. The real parser: megatron/training (and megatron/legacy, which it imports) at REF
   are extracted to a temporary folder and ``add_megatron_arguments`` builds the
   parser, which adds the flags that ``ArgumentGroupFactory`` generates from
   dataclasses (TransformerConfig, TrainingConfig, SchedulerConfig, ...). Optional
   third-party imports the parser never uses (six, regex) are stubbed.
Every flag of (1) must be in (2); the JSON holds (2): per option string its dest,
action, type, choices, nargs and default, plus the source commit.
"""

import argparse
import ast
import enum
import importlib.abc
import importlib.machinery
import json
import subprocess
import sys
import tarfile
import tempfile
import types
from io import BytesIO
from pathlib import Path

ARGUMENTS = "megatron/training/arguments.py"
STUBBED = ("six", "regex")


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for optional imports that are not installed (last on sys.meta_path)."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__, module.__file__ = [], "<stub>"

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})
        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass


def git(git_dir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True,
                          capture_output=True).stdout


def ast_flags(source: str) -> dict[str, dict]:
    """--flag -> literal keyword arguments of each add_argument call in the file."""
    flags = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str) and a.value.startswith("--")]
        info = {}
        for kw in node.keywords:
            if kw.arg in ("action", "nargs") and isinstance(kw.value, ast.Constant):
                info[kw.arg] = kw.value.value
            elif kw.arg == "type" and isinstance(kw.value, ast.Name):
                info["type"] = kw.value.id
            elif kw.arg == "choices":
                try:
                    info["choices"] = list(ast.literal_eval(kw.value))
                except ValueError:
                    pass
        for name in names:
            flags[name] = info
    return flags


def real_parser(tree: Path) -> argparse.ArgumentParser:
    """Megatron-LM's own parser from the extracted source (``megatron.training``'s
    package __init__ is skipped: it imports the whole trainer)."""
    sys.meta_path.append(_Stubs())
    sys.path.insert(0, str(tree))
    package = types.ModuleType("megatron.training")
    package.__path__ = [str(tree / "megatron" / "training")]
    sys.modules["megatron.training"] = package
    import megatron.training.global_vars as global_vars
    for name in dir(global_vars):
        if name.startswith("get_"):
            setattr(package, name, getattr(global_vars, name))
    import megatron.training.arguments as arguments
    parser = argparse.ArgumentParser(allow_abbrev=False)
    return arguments.add_megatron_arguments(parser)


def _jsonable(value):
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def describe(action: argparse.Action) -> dict:
    kind = type(action).__name__
    if kind in ("_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction"):
        action_name = {"_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
                       "_StoreConstAction": "store_const"}[kind]
    else:
        action_name = "store" if kind == "_StoreAction" else kind
    type_name = None
    choices = None
    if action.choices is not None:
        choices = [_jsonable(c) for c in action.choices]
    if action.type is not None:
        type_name = getattr(action.type, "__name__", repr(action.type))
        if type_name not in ("int", "float", "str"):
            if choices and all(isinstance(c, enum.Enum) for c in action.choices):
                type_name = "enum"
            else:
                type_name = "str"   # custom converters take a string
    return {"dest": action.dest, "action": action_name, "type": type_name, "choices": choices,
            "nargs": action.nargs, "default": _jsonable(action.default)}


def main() -> int:
    import megatron.core
    git_dir = sys.argv[1]
    ref = sys.argv[2] if len(sys.argv) > 2 else f"core_v{megatron.core.__version__}"
    commit = git(git_dir, "rev-parse", f"{ref}^{{commit}}").decode().strip()
    source = git(git_dir, "show", f"{commit}:{ARGUMENTS}").decode()
    literal = ast_flags(source)
    with tempfile.TemporaryDirectory() as folder:
        archive = git(git_dir, "archive", "--format=tar", commit, "megatron/training",
                      "megatron/legacy")
        tarfile.open(fileobj=BytesIO(archive)).extractall(folder, filter="data")
        parser = real_parser(Path(folder))
    options = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                options[flag] = describe(action)
    # Flags the file adds only when an optional library is importable (Kitchen):
    # recorded apart, never accepted by the tests.
    conditional = sorted(set(literal) - set(options))
    unexpected = [flag for flag in conditional if "kitchen" not in flag]
    if unexpected:
        raise SystemExit(f"ast found flags the parser lacks: {unexpected}")
    json.dump({"source": "https://github.com/NVIDIA/Megatron-LM", "ref": ref, "commit": commit,
               "file": ARGUMENTS, "megatron_core": megatron.core.__version__,
               "how": "scripts/megatron_lm_args.py: the real add_megatron_arguments parser "
                      "(dataclass-generated groups included), cross-checked with an ast "
                      f"reading of {len(literal)} literal add_argument flags",
               "conditional_not_added": conditional,
               "options": dict(sorted(options.items()))}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
