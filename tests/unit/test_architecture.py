"""The house's floors, read from the code's own imports: nothing reaches back up, room by room.

From the ground up: the protocol (errors, hooks, events, the batch formats) imports nothing of
ours; each plugin imports only the protocol; the plugin registry composes the plugins; the
model families' torch-free half (rules, parameter and FLOPs terms) stands on the protocol; the
torch-free config machinery composes the registry and the families; the recipe catalogue
builds configs; resolution sits above both; the planner above resolution; data preparation
beside it; the training loop (its checkpoint package, trainer/checkpoint/, included) above all
of that; HF interop, launch and the user tools above the loop; the entry pipeline and its
command objects above everything; the scripts call only the entry contract. Each rule is also
shown to fail on a planted violation.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("plugins", "recipes", "data_prep", "trainer", "scripts")
CATALOGUE = "recipes (catalogue)"

# room -> the rooms it may import (besides itself). A plugin is one room per folder.
LOWER = {
    "plugins.protocol": set(),
    "plugin": {"plugins.protocol"},
    "plugins.registry": {"plugins.protocol", "plugin"},
    "recipes.models": {"plugins.protocol"},
    "recipes.config": {"plugins.protocol", "plugins.registry", "recipes.models"},
    CATALOGUE: {"plugins.protocol", "recipes.models", "recipes.config"},
    "recipes.resolve": {"plugins.protocol", "recipes.models", "recipes.config", CATALOGUE},
    "recipes.plan": {"plugins.protocol", "recipes.models", "recipes.config", CATALOGUE,
                     "recipes.resolve"},
    "data_prep": {"plugins.protocol", "recipes.config"},
}
BELOW_THE_LOOP = {"plugins.protocol", "plugins.registry", "recipes.models", "recipes.config",
                  CATALOGUE, "recipes.resolve", "recipes.plan", "data_prep"}
LOWER["trainer (loop)"] = BELOW_THE_LOOP
LOWER["trainer.interop"] = BELOW_THE_LOOP | {"trainer (loop)"}
LOWER["trainer.launch"] = BELOW_THE_LOOP | {"trainer (loop)"}
# Tools are programs built on the trainer; compare_runs draws with the logging plugin's curves.
LOWER["trainer.tools"] = BELOW_THE_LOOP | {"trainer (loop)", "trainer.launch", "plugin"}
LOWER["trainer.entry"] = BELOW_THE_LOOP | {"trainer (loop)", "trainer.launch", "trainer.tools",
                                           "trainer.interop"}
LOWER["scripts"] = {"trainer.entry"}
TOOLS_MAY_USE = {"plugins.logging.curves"}  # the only plugin module a tool imports


def room_of(module: str) -> str | None:
    """The room a module of ours belongs to (None: not ours)."""
    parts = module.split(".")
    if parts[0] == "plugins":
        if len(parts) == 1 or parts[1] in ("protocol", "registry"):
            return ".".join(parts[:2])
        return "plugin"
    if parts[0] == "recipes":
        if len(parts) > 1 and parts[1] in ("models", "config", "resolve", "plan"):
            return ".".join(parts[:2])
        return CATALOGUE
    if parts[0] == "data_prep":
        return "data_prep"
    if parts[0] == "trainer":
        if len(parts) > 1 and parts[1] in ("entry", "launch", "tools", "interop"):
            return ".".join(parts[:2])
        return "trainer (loop)"
    if parts[0] == "scripts":
        return "scripts"
    return None


def module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def is_our_module(name: str) -> bool:
    path = REPO / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


# One parse per source text in the session: every rule and every planted violation walks the
# same trees (the walks only read them).
parsed = functools.cache(ast.parse)


@functools.cache
def _file_imports(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names
                         if is_our_module(f"{node.module}.{alias.name}"))
    return frozenset(names)


def imported_modules(folder: str) -> dict[str, set[str]]:
    """Every module each .py file under `folder` imports (top-level and inside functions);
    `from a.b import c` counts `a.b`, and `a.b.c` too when that is a module of ours."""
    return {str(path.relative_to(REPO)): set(_file_imports(path))
            for path in sorted((REPO / folder).rglob("*.py"))}


def all_imports() -> dict[str, set[str]]:
    return {path: names for folder in PRODUCT for path, names in imported_modules(folder).items()}


def floor_violations(imports: dict[str, set[str]]) -> list[str]:
    """Every import that runs up a floor, or sideways between two plugins."""
    bad = []
    for path, names in imports.items():
        own_module = module_of(path)
        own = room_of(own_module)
        for name in names:
            target = room_of(name)
            if target is None:
                continue
            if own == "plugin" and target == "plugin":
                if name.split(".")[1] != own_module.split(".")[1]:
                    bad.append(f"{path} imports {name} (a plugin imports another plugin)")
                continue
            if target == own:
                continue
            if own == "trainer.tools" and target == "plugin" and name not in TOOLS_MAY_USE:
                bad.append(f"{path} imports {name} (a tool may use only {TOOLS_MAY_USE})")
            elif target not in LOWER[own]:
                bad.append(f"{path} imports {name} ({own} may not import {target})")
    return sorted(bad)


# Parts of the trainer the launching process runs before it imports torch: the checkpoint checks
# (a damaged or unloadable checkpoint is refused in about a second) and the families' Hugging
# Face configs (a model directory of another shape is refused before a conversion starts).
TORCH_FREE_TRAINER = ("trainer/__init__.py", "trainer/checkpoint/__init__.py",
                      "trainer/checkpoint/checksums.py", "trainer/checkpoint/format.py",
                      "trainer/checkpoint/manifest.py", "trainer/checkpoint/megatron_lm.py",
                      "trainer/checkpoint/preflight.py", "trainer/models/__init__.py",
                      "trainer/models/gpt/__init__.py", "trainer/models/gpt/hf_config.py",
                      "trainer/models/hybrid/__init__.py", "trainer/models/hybrid/hf_config.py",
                      "trainer/interop/__init__.py", "trainer/interop/hf_config.py")


def torch_violations(imports: dict[str, set[str]]) -> list[str]:
    """Resolving and validating a config, and checking the checkpoint it loads, import no torch:
    the protocol, every plugin's config, the registry, all of recipes/ and the trainer's
    checkpoint checks are torch-free; those checks import no other module of the trainer."""
    torch_free = [path for path in imports
                  if path.startswith(("plugins/protocol/", "recipes/", "plugins/registry.py"))
                  or (path.startswith("plugins/") and path.endswith("/config.py"))
                  or path in TORCH_FREE_TRAINER]
    own_torch_free = {module_of(path) for path in TORCH_FREE_TRAINER}
    return sorted(f"{path} imports {name}" for path in torch_free for name in imports[path]
                  if name.split(".")[0] in ("torch", "megatron")
                  or (name.split(".")[0] == "trainer" and name not in own_torch_free))


def test_no_import_runs_up_a_floor():
    assert floor_violations(all_imports()) == []


def test_config_resolution_is_torch_free():
    assert torch_violations(all_imports()) == []


@pytest.mark.parametrize(("path", "name"), [
    ("plugins/protocol/errors.py", "plugins.registry"),  # the ground floor imports nothing
    ("plugins/context_parallel/config.py", "plugins.packing.plugin"),  # sideways
    ("plugins/fp8/config.py", "recipes.config.schema"),  # a plugin reaches the config above
    ("recipes/config/schema.py", "recipes.registry"),  # the machinery reaches the catalogue
    ("recipes/models/hybrid/rules.py", "recipes.config.layout"),  # a family reaches the config
    ("recipes/models/gpt/params.py", "recipes.plan.params"),  # a family reaches the planner
    ("recipes/config/validation.py", "recipes.resolve"),
    ("recipes/llama3.py", "recipes.plan.flops"),  # the catalogue reaches the planner
    ("recipes/plan/flops.py", "trainer.throughput"),  # recipes reach the trainer
    ("data_prep/packing.py", "trainer.data"),
    ("trainer/step.py", "trainer.tools.benchmarks.step"),  # the loop reaches a tool
    ("trainer/loop.py", "trainer.entry.pipeline"),
    ("trainer/session.py", "plugins.fp8.plugin"),  # the loop names a plugin
    ("trainer/launch/cluster.py", "trainer.tools.scaling.sweep"),
    ("trainer/interop/cli.py", "trainer.entry.contract"),
    ("trainer/tools/benchmarks/step.py", "trainer.entry.commands"),
    ("trainer/tools/dry_run.py", "plugins.fp8.plugin"),  # a tool beyond the curves
    ("scripts/pretrain.py", "trainer.loop"),  # a script skips the entry contract
])
def test_each_floor_rule_fails_on_a_planted_violation(path, name):
    imports = all_imports()
    imports[path] = {*imports[path], name}
    assert [line for line in floor_violations(imports) if line.startswith(f"{path} imports "
                                                                          f"{name} ")]


@pytest.mark.parametrize("path", ["plugins/protocol/hooks.py", "plugins/packing/config.py",
                                  "recipes/plan/flops.py", "plugins/registry.py",
                                  "recipes/models/hybrid/params.py",
                                  "trainer/models/hybrid/hf_config.py",
                                  "trainer/checkpoint/format.py", "trainer/checkpoint/manifest.py",
                                  "trainer/checkpoint/megatron_lm.py",
                                  "trainer/checkpoint/preflight.py"])
def test_the_torch_free_rule_fails_on_a_planted_import(path):
    imports = all_imports()
    imports[path] = {*imports[path], "torch"}
    assert torch_violations(imports) == [f"{path} imports torch"]


@pytest.mark.parametrize(("path", "name"), [
    ("trainer/checkpoint/preflight.py", "trainer.checkpoint.save"),  # torch through our own
    ("trainer/checkpoint/manifest.py", "trainer.state"),
])
def test_the_checkpoint_checks_reach_no_torch_through_the_trainer(path, name):
    imports = all_imports()
    imports[path] = {*imports[path], name}
    assert torch_violations(imports) == [f"{path} imports {name}"]


def test_the_checkpoint_checks_import_no_torch_when_run():
    """What the static rule promises, in a fresh interpreter: the pre-flight's modules load
    without torch or Megatron."""
    code = ("import sys\n"
            "import trainer.checkpoint.preflight\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == "[]"


# trainer/checkpoint/, its torch-free checks first: each module imports only those before it.
CHECKPOINT_ORDER = ("checksums", "format", "manifest", "megatron_lm", "preflight",
                    "megatron_fixes",
                    "fsdp_dtensor",
                    "state_dicts", "disk_errors", "publish", "async_save", "save", "load")


def checkpoint_order_violations(imports: dict[str, set[str]]) -> list[str]:
    """Every import inside trainer/checkpoint/ of a module listed after the importer (or not
    listed): the package's modules form one line, so none can import the other in a circle."""
    bad = []
    for path, names in imports.items():
        if not path.startswith("trainer/checkpoint/") or path.endswith("__init__.py"):
            continue
        own = CHECKPOINT_ORDER.index(module_of(path).rsplit(".", 1)[1])
        for name in names:
            if name.startswith("trainer.checkpoint."):
                target = name.split(".")[2]
                if target not in CHECKPOINT_ORDER[:own]:
                    bad.append(f"{path} imports {name}")
    return sorted(bad)


def test_the_checkpoint_modules_import_only_those_before_them():
    checkpoint = {path.stem for path in (REPO / "trainer" / "checkpoint").glob("*.py")}
    assert checkpoint - {"__init__"} == set(CHECKPOINT_ORDER)
    assert checkpoint_order_violations(all_imports()) == []


@pytest.mark.parametrize(("path", "name"), [
    ("trainer/checkpoint/publish.py", "trainer.checkpoint.save"),  # a circle save -> publish
    ("trainer/checkpoint/format.py", "trainer.checkpoint.manifest"),
])
def test_the_checkpoint_order_fails_on_a_planted_import(path, name):
    imports = all_imports()
    imports[path] = {*imports[path], name}
    assert checkpoint_order_violations(imports) == [f"{path} imports {name}"]


# Megatron's parallel-size keywords, which only the one translation spells.
PARALLEL_KEYWORDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                     "virtual_pipeline_model_parallel_size", "context_parallel_size",
                     "expert_model_parallel_size", "expert_tensor_parallel_size")


def keyword_setters(files: dict[str, str]) -> dict[str, list[str]]:
    """Which file sets which parallel-size keyword: assigns it, passes it as a keyword
    argument, or spells it as a dict key (reading one back from a built config is fine)."""
    found: dict[str, set[str]] = {}
    for path, text in files.items():
        for node in ast.walk(parsed(text)):
            names = []
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.attr for t in targets if isinstance(t, ast.Attribute)]
            elif isinstance(node, ast.keyword):
                names = [node.arg]
            elif isinstance(node, ast.Dict):
                names = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                names = [node.slice.value] if isinstance(node.ctx, ast.Store) else []
            for name in names:
                if name in PARALLEL_KEYWORDS:
                    found.setdefault(path, set()).add(name)
    return {path: sorted(names) for path, names in found.items()}


def product_sources() -> dict[str, str]:
    return {str(path.relative_to(REPO)): path.read_text(encoding="utf-8")
            for folder in PRODUCT for path in (REPO / folder).rglob("*.py")}


def test_parallel_sizes_reach_megatron_in_one_place():
    """Only trainer/mcore_translation.py sets Megatron's parallel sizes, from the run's layout.
    The one other setter is the CPU runtime's reference CP attention, a stand-in for TE's: it
    builds Megatron's local attention (which refuses CP) from a CP-free copy of the config."""
    setters = keyword_setters(product_sources())
    assert set(setters.pop("trainer/mcore_translation.py")) == set(PARALLEL_KEYWORDS)
    assert setters == {"trainer/cpu_runtime/cp_attention.py": ["context_parallel_size"]}


def test_the_parallel_size_rule_fails_on_a_planted_keyword():
    files = product_sources()
    files["trainer/tools/dry_run.py"] += "\nconfig.tensor_model_parallel_size = 1\n"
    files["trainer/model.py"] += "\nbuild(context_parallel_size=1)\n"
    setters = keyword_setters(files)
    assert setters["trainer/tools/dry_run.py"] == ["tensor_model_parallel_size"]
    assert setters["trainer/model.py"] == ["context_parallel_size"]


# Where a plugin may be named besides its own folder and the registry that lists it: the recipe
# catalogue, whose recipes are configurations (a recipe may turn a plugin on). The rest of
# recipes/ is the machinery every configuration goes through.
RECIPE_MACHINERY = ("recipes/config/", "recipes/plan/", "recipes/models/", "recipes/resolve.py",
                    "recipes/registry.py")


def plugin_names() -> set[str]:
    from plugins.registry import PluginsConfig

    return {f.name for f in dataclasses.fields(PluginsConfig)}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (modules, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            found.add(id(body[0].value))
    return found


def named_plugins(files: dict[str, str], names: set[str]) -> list[str]:
    """Every place outside a plugin's own code, the registry and the recipe catalogue that names
    a plugin: an import is the floor rule's; here a string such as an override
    `plugins.<name>.<key>=...` or a message naming one, and a config attribute
    `<cfg>.plugins.<name>` or `getattr(<cfg>.plugins, "<name>")`. Docstrings and comments may
    talk about plugins."""
    spelled = re.compile(r"\bplugins\.(" + "|".join(sorted(names)) + r")\b")
    bad = []
    for path, text in files.items():
        if path.startswith("plugins/") or (
                path.startswith("recipes/") and not path.startswith(RECIPE_MACHINERY)):
            continue
        tree = parsed(text)
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    id(node) not in docs) and (found := spelled.search(node.value)):
                bad.append(f"{path}:{node.lineno} names {found.group(0)} in a string")
            elif isinstance(node, ast.Attribute) and node.attr in names and isinstance(
                    node.value, ast.Attribute) and node.value.attr == "plugins":
                bad.append(f"{path}:{node.lineno} reads the config section plugins.{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                    node.func.id == "getattr") and len(node.args) >= 2 and isinstance(
                    node.args[0], ast.Attribute) and node.args[0].attr == "plugins" and (
                    isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
                bad.append(f"{path}:{node.lineno} reads the config section "
                           f"plugins.{node.args[1].value}")
    return sorted(bad)


def test_only_plugins_the_registry_and_recipes_name_a_plugin():
    """The trainer, data preparation, the scripts and the config machinery work with any set of
    plugins: none names one, not even through an override string or a config attribute (a
    feature they need is a core field the plugin derives from, or a protocol hook)."""
    assert named_plugins(product_sources(), plugin_names()) == []


@pytest.mark.parametrize("planted", [
    'args.append("plugins.fp8.format=hybrid")\n',  # an override string
    "threads = cfg.plugins.fp8.margin\n",  # a config attribute
    'section = getattr(cfg.plugins, "fp8", None)\n',  # a getattr on the section
])
def test_the_plugin_naming_rule_fails_on_a_planted_name(planted):
    files = product_sources()
    files["trainer/launch/cluster.py"] += "\n" + planted
    assert [line for line in named_plugins(files, plugin_names())
            if line.startswith("trainer/launch/cluster.py:")]


def _tracked(patterns: tuple[str, ...]) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    return [REPO / name for name in listed]


OUTSIDE = ("../" + "shared", "shared/" + "notes")  # spelled apart: this file is scanned too
# An issue number, a tracker reference, or a document the reader of this repository lacks.
NOT_HERE = re.compile("|".join([r"\bissue #?\d", r"\(#\d+\)", r"#\d+ item",
                                "issue " + "tracker", "domain " + "text"]), re.IGNORECASE)


def test_nothing_refers_outside_the_repository():
    texts = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8", errors="replace")
             for p in _tracked(("*.py", "*.md", "*.toml", "*.sh", "*.yaml", "scripts/agent/*"))}
    offenders = [f"{path}:{number}: {line.strip()[:80]}" for path, text in texts.items()
                 for number, line in enumerate(text.splitlines(), 1)
                 if any(o in line for o in OUTSIDE) or NOT_HERE.search(line)]
    assert offenders == []


def test_test_files_have_unique_names():
    """The test folders are not packages, so pytest imports test files by basename: two files
    of one name in unit/ and dist/ stop the whole suite at collection."""
    names = [path.name for path in (REPO / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_no_merge_leftovers_are_tracked():
    """Backup files of a patch or merge (`*.orig`, `*.rej`) are never part of the house."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert [name for name in tracked if name.endswith((".orig", ".rej"))] == []


def test_every_imported_package_is_declared():
    """Each third-party package the product imports is a dependency of pyproject.toml (or of
    an extra, for code that only runs with it)."""
    import sys
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[\[=<>!~ ]", dep)[0].lower().replace("-", "_")
                for dep in [*project["dependencies"],
                            *(d for deps in project["optional-dependencies"].values()
                              for d in deps)]}
    imported_as = {"yaml": "pyyaml", "megatron": "megatron_core", "nemo_run": "nemo_run",
                   "transformer_engine": "transformer_engine"}
    ours = {"plugins", "recipes", "data_prep", "trainer", "scripts"}
    tops = {name.split(".")[0] for names in all_imports().values() for name in names}
    third_party = {t for t in tops if t not in ours and t not in sys.stdlib_module_names}
    missing = sorted(t for t in third_party
                     if imported_as.get(t, t).lower().replace("-", "_") not in declared)
    assert missing == []


# A family may build on the families before it (a hybrid model has GPT attention and MoE
# layers), never on one after it; the shared modules of recipes/models/ import no family.
FAMILY_ORDER = ("gpt", "moe", "hybrid")


def family_violations(imports: dict[str, set[str]]) -> list[str]:
    bad = []
    for path, names in imports.items():
        parts = path.split("/")
        if parts[0] not in ("recipes", "trainer") or len(parts) < 3 or parts[1] != "models":
            continue
        own = parts[2] if parts[2] in FAMILY_ORDER else None
        allowed = FAMILY_ORDER[:FAMILY_ORDER.index(own)] if own else ()
        for name in names:
            bits = name.split(".")
            if bits[:2] == [parts[0], "models"] and len(bits) > 2 and bits[2] in FAMILY_ORDER \
                    and bits[2] != own and bits[2] not in allowed:
                bad.append(f"{path} imports {name}")
    return sorted(bad)


def test_families_build_on_earlier_families_only():
    assert family_violations(all_imports()) == []


@pytest.mark.parametrize(("path", "name"), [
    ("recipes/models/gpt/params.py", "recipes.models.hybrid.pattern"),
    ("recipes/models/kinds.py", "recipes.models.moe.params"),
    ("trainer/models/gpt/hf_tensors.py", "trainer.models.hybrid.hf_tensors"),
])
def test_the_family_rule_fails_on_a_planted_import(path, name):
    imports = all_imports()
    imports[path] = {*imports[path], name}
    assert family_violations(imports) == [f"{path} imports {name}"]
