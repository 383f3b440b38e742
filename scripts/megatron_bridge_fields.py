"""Record the fields of Megatron-Bridge's ConfigContainer sections as test data.

    python scripts/megatron_bridge_fields.py BRIDGE_GIT_DIR MEGATRON_LM_GIT_DIR \
        [BRIDGE_REF [MEGATRON_LM_REF]] > tests/data/megatron_bridge_fields.json

Megatron-Bridge needs Transformer Engine (a CUDA build) at import time
(megatron/bridge/peft/lora_layers.py imports transformer_engine.pytorch), so it
cannot be imported on a machine without a GPU toolchain. Instead this reads the
sources with ``ast``: every annotated field of each section's dataclass and of
its base classes, following imports across Megatron-Bridge (src/) and
Megatron-LM (megatron/, the version Bridge builds on; default ref: main's HEAD).
Also records the recipe functions the llama, gpt and MoE (DeepSeek, Qwen, GPT-OSS,
Kimi) recipe packages export, the mixed-precision recipe names, and the fields
of the model providers a recipe's ``cfg.model`` may be instead of
GPTModelProvider (MLAModelProvider: DeepSeek-V3 and Kimi K2 recipes).
"""

import ast
import json
import subprocess
import sys

SECTIONS = {
    "model": ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "scheduler": ("megatron.bridge.training.config", "SchedulerConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "dataset": ("megatron.bridge.training.config", "GPTDatasetConfig"),
    "checkpoint": ("megatron.bridge.training.config", "CheckpointConfig"),
    "tokenizer": ("megatron.bridge.training.tokenizers.config", "TokenizerConfig"),
    "mixed_precision": ("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig"),
    "comm_overlap": ("megatron.bridge.training.comm_overlap", "CommOverlapConfig"),
}
RECIPE_MODULES = ("megatron.bridge.recipes.llama", "megatron.bridge.recipes.gpt",
                  "megatron.bridge.recipes.gpt.gpt3_175b", "megatron.bridge.recipes.deepseek",
                  "megatron.bridge.recipes.qwen", "megatron.bridge.recipes.gpt_oss",
                  "megatron.bridge.recipes.kimi")
PROVIDERS = {"MLAModelProvider": ("megatron.bridge.models.mla_provider", "MLAModelProvider")}
"""Model providers other than GPTModelProvider that recipes build (model section)."""


class Sources:
    """Python modules of the two repositories at fixed commits, parsed on demand."""

    def __init__(self, bridge: tuple[str, str], mlm: tuple[str, str]):
        self.repos = {"bridge": bridge, "mlm": mlm}
        self.files = {name: set(self._git(name, "ls-tree", "-r", "--name-only", ref).split())
                      for name, (_, ref) in self.repos.items()}
        self.cache = {}

    def _git(self, name, *args) -> str:
        git_dir = self.repos[name][0]
        return subprocess.run(["git", "--git-dir", git_dir, *args], check=True,
                              capture_output=True, text=True).stdout

    def module(self, dotted: str) -> ast.Module | None:
        if dotted in self.cache:
            return self.cache[dotted]
        repo, prefix = ("bridge", "src/") if dotted.startswith("megatron.bridge") else ("mlm", "")
        base = prefix + dotted.replace(".", "/")
        tree = None
        for path in (base + ".py", base + "/__init__.py"):
            if path in self.files[repo]:
                tree = ast.parse(self._git(repo, "show", f"{self.repos[repo][1]}:{path}"))
                break
        self.cache[dotted] = tree
        return tree

    def find_class(self, dotted: str, name: str, depth: int = 0):
        """(module, ClassDef) of ``name`` as seen from module ``dotted``."""
        tree = self.module(dotted)
        if tree is None or depth > 6:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return dotted, node
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                source = node.module
                if node.level:
                    parts = dotted.split(".")
                    package = parts if self.module(dotted) is not None and \
                        self._is_package(dotted) else parts[:-1]
                    package = package[:len(package) - node.level + 1]
                    source = ".".join(package + [node.module])
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        found = self.find_class(source, alias.name, depth + 1)
                        if found:
                            return found
        return None

    def _is_package(self, dotted: str) -> bool:
        repo, prefix = ("bridge", "src/") if dotted.startswith("megatron.bridge") else ("mlm", "")
        return prefix + dotted.replace(".", "/") + "/__init__.py" in self.files[repo]

    def fields(self, dotted: str, name: str) -> set[str]:
        found = self.find_class(dotted, name)
        if found is None:
            return set()
        module, node = found
        names = {stmt.target.id for stmt in node.body
                 if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
        for base in node.bases:
            if isinstance(base, ast.Subscript):
                base = base.value
            base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            if base_name and base_name not in ("object", "Generic"):
                names |= self.fields(module, base_name)
        return names

    def exported(self, dotted: str) -> list[str]:
        tree = self.module(dotted)
        names = set()
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.ImportFrom):
                names |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.FunctionDef):
                names.add(node.name)
        return sorted(n for n in names if n.endswith("_config"))


def main() -> int:
    bridge_dir, mlm_dir = sys.argv[1], sys.argv[2]
    bridge_ref = sys.argv[3] if len(sys.argv) > 3 else "HEAD"
    mlm_ref = sys.argv[4] if len(sys.argv) > 4 else "HEAD"

    def sha(git_dir, ref):
        return subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{ref}^{{commit}}"],
                              check=True, capture_output=True, text=True).stdout.strip()
    bridge_sha, mlm_sha = sha(bridge_dir, bridge_ref), sha(mlm_dir, mlm_ref)
    src = Sources((bridge_dir, bridge_sha), (mlm_dir, mlm_sha))
    sections = {}
    for section, (module, name) in SECTIONS.items():
        names = src.fields(module, name)
        if not names:
            raise SystemExit(f"no fields found for {section}: {module}.{name}")
        sections[section] = sorted(names)
    mp = src.module("megatron.bridge.training.mixed_precision")
    mixed = sorted(f.name for f in mp.body if isinstance(f, ast.FunctionDef)
                   and any(getattr(d, "id", None) == "register" for d in f.decorator_list))
    json.dump({"bridge": {"source": "https://github.com/NVIDIA-NeMo/Megatron-Bridge",
                          "commit": bridge_sha},
               "megatron_lm": {"source": "https://github.com/NVIDIA/Megatron-LM",
                               "commit": mlm_sha},
               "how": "scripts/megatron_bridge_fields.py (ast over both sources)",
               "sections": sections,
               "recipes": {m: src.exported(m) for m in RECIPE_MODULES},
               "mixed_precision_recipes": mixed,
               "providers": {name: sorted(src.fields(module, cls))
                             for name, (module, cls) in PROVIDERS.items()}},
              sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
