"""The layers of models/ import only downward: capsnet (the network family) imports neither analysis
nor app, analysis does not import app, and nothing under tinygrad_caps/ imports models; inside app/,
the rooms import downward too (cli -> studies -> training), and inside capsnet/routing/ the modules.
Read from the source with ``ast``, so an import inside a function counts too. No code of ours imports
an old module path (models/_moved.py), so none needs resolving here."""
import ast
import re
import types
from pathlib import Path

import pytest

from paths import ROOT
from tinygrad_caps.models._moved import MOVED

MODELS = ROOT / "models"
PACKAGE = "tinygrad_caps.models"


def module_name(path: Path) -> str:
    """models/app/cli.py -> tinygrad_caps.models.app.cli.parser (a package's __init__ is the package)."""
    parts = list(path.relative_to(MODELS).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGE, *parts])


def imported_modules(path: Path, package: str) -> set:
    """Every module ``path`` imports (absolute names; ``from X import name`` counts X and X.name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {resolved(name) for name in found}


def resolved(name: str) -> str:
    """``models.X`` (the source folder) as ``tinygrad_caps.models.X``."""
    if name == "models" or name.startswith("models."):
        name = PACKAGE + name[len("models"):]
    return name


def layer_imports(layer: str) -> dict:
    """{module of the layer: the tinygrad_caps.models modules it imports}."""
    result = {}
    for path in sorted((MODELS / layer).rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        result[name] = {m for m in imported_modules(path, package) if m.startswith(PACKAGE)}
    return result


@pytest.mark.parametrize("layer, forbidden", [("capsnet", ("analysis", "app")), ("analysis", ("app",))])
def test_a_layer_imports_no_layer_above_it(layer, forbidden):
    imports = layer_imports(layer)
    assert imports, f"models/{layer}/ has no modules"
    wrong = {module: sorted(m for m in targets if m.split(".")[2] in forbidden)
             for module, targets in imports.items()}
    assert not {m: t for m, t in wrong.items() if t}


# the parts of a training run: each imports neither the loop nor a part called after it
TRAINER_PARTS = ("callbacks", "evaluation", "stopping", "run_data", "step_runner", "preflight", "checkpointing",
                 "metrics_file", "progress", "tensorboard_sink", "gradflow_log")


def test_the_option_facility_is_below_every_config_and_the_trainers_parts_below_the_loop():
    """models/options.py imports no module of the models (every config builds on it); CapsNetConfig's
    and TrainingConfig's modules declare their fields with it; no part of a run imports the Trainer."""
    options = imported_modules(MODELS / "options.py", PACKAGE)
    assert not {m for m in options if m.startswith(PACKAGE + ".")}, sorted(options)
    for config in ("capsnet/config.py", "app/training/config.py"):
        package = module_name(MODELS / config).rpartition(".")[0]
        assert f"{PACKAGE}.options" in imported_modules(MODELS / config, package), config
    training = f"{PACKAGE}.app.training"
    for part in TRAINER_PARTS:
        path = MODELS / "app" / "training" / f"{part}.py"
        loop = (f"{training}.trainer", f"{training}.distributed")
        above = {m for m in imported_modules(path, training) if m.startswith(loop)}
        assert not above, f"app/training/{part}.py imports {sorted(above)}"


def test_the_engine_imports_no_models():
    for path in sorted((ROOT / "tinygrad_caps").rglob("*.py")):
        package = ".".join(("tinygrad_caps", *path.relative_to(ROOT / "tinygrad_caps").with_suffix("").parts))
        if path.name != "__init__.py":
            package = package.rpartition(".")[0]
        imports = imported_modules(path, package)
        assert not {m for m in imports if m.startswith(PACKAGE) or m == "models" or m.startswith("models.")}, path


def test_the_checker_sees_an_upward_import(tmp_path):
    """The resolution of relative imports, on imports that would break the layering."""
    module = tmp_path / "m.py"
    module.write_text("from ..app.training import trainer\nfrom .. import analysis\nfrom ..analysis.plots import pyplot\n")
    assert imported_modules(module, f"{PACKAGE}.capsnet") >= {
        f"{PACKAGE}.app.training", f"{PACKAGE}.app.training.trainer", f"{PACKAGE}.analysis",
        f"{PACKAGE}.analysis.plots"}


@pytest.mark.parametrize("room, forbidden", [("training", ("studies", "cli")), ("studies", ("cli",))])
def test_a_room_of_app_imports_no_room_above_it(room, forbidden):
    imports = layer_imports(f"app/{room}")
    assert imports, f"models/app/{room}/ has no modules"
    wrong = {module: sorted(m for m in targets if m.startswith(f"{PACKAGE}.app.") and m.split(".")[3] in forbidden)
             for module, targets in imports.items()}
    assert not {m: t for m, t in wrong.items() if t}


STUDIES = f"{PACKAGE}.app.studies"
# The floors of models/app/studies/, lowest first: a module imports only modules of the floors below its
# own. At the bottom what knows the files (the folder's layout, the plan file's checks, the outcomes) and
# what is declared (the registry, the placement); then the plan and the locks; one run's task; the
# processes and executors that train runs (none importing the driver or the runner); the one scheduling
# loop and the choice of executor; the orchestration of a call; the summary above everything it reads.
STUDIES_FLOORS = (
    ("folder", "outcome", "plan_file", "placement", "registry", "study_progress"),
    ("lock", "plan"),
    ("run_task",),
    ("worker", "in_process_executor", "local_executor", "ray_executor"),
    ("executors", "driver"),
    ("runner",),
    ("summary",),
)


def test_the_studies_room_imports_downward_floor_by_floor():
    folder = MODELS / "app" / "studies"
    floors = {module: level for level, modules in enumerate(STUDIES_FLOORS) for module in modules}
    modules = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    assert modules == set(floors), "place a new module of app/studies/ on a floor of STUDIES_FLOORS"
    for module, level in floors.items():
        siblings = {name[len(STUDIES) + 1:].split(".")[0] for name in imported_modules(folder / f"{module}.py", STUDIES)
                    if name.startswith(STUDIES + ".")}
        above = sorted(s for s in siblings if floors.get(s, len(STUDIES_FLOORS)) >= level)
        assert not above, f"app/studies/{module}.py imports {above}, on its floor or above it"
    executors = STUDIES_FLOORS[3]
    assert all(floors["driver"] > floors[e] and floors["runner"] > floors[e] for e in executors)


def test_app_holds_only_its_three_rooms():
    modules = {p.name for p in (MODELS / "app").iterdir() if p.name != "__pycache__"}
    assert modules == {"__init__.py", "cli", "studies", "training"}, "put a new module of app/ into its room"


def test_no_code_of_ours_imports_an_old_module_path():
    import tinygrad_caps.models as models

    exports = {name for name, value in vars(models).items() if not isinstance(value, types.ModuleType)}
    old_paths = {f"{PACKAGE}.{old}" for old in MOVED if old not in exports}  # routing_statistics: the function
    for folder in ("models", "tinygrad_caps", "kernels", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if folder == "models":
                name = module_name(path)
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            else:
                package = "tests"  # absolute imports only outside models/
            used = {m for m in imported_modules(path, package) if m in old_paths}
            assert not used, f"{path.relative_to(ROOT)} imports {sorted(used)}: use the new paths (CHANGELOG.md)"


ROUTING = f"{PACKAGE}.capsnet.routing"
# module of models/capsnet/routing/ -> the modules of that package it may import: the shared helpers, the
# layer interface, one module per algorithm (none importing another, but dynamic's CapsuleLayer runs
# uniform routing), the registry above them all, and the package's __init__ above the registry.
ROUTING_IMPORTS = {
    "common": set(),
    "base": {"common"},
    "uniform": {"common"},
    "dynamic": {"common", "base", "uniform"},
    "em": {"common", "base"},
    "self_attention": {"common", "base"},
    "self_routing": {"common", "base"},
    "registry": {"base", "dynamic", "em", "self_attention", "self_routing"},
}


def test_the_routing_package_imports_downward():
    folder = MODELS / "capsnet" / "routing"
    modules = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    assert modules == set(ROUTING_IMPORTS), "place a new module of capsnet/routing/ in ROUTING_IMPORTS"
    for module, allowed in ROUTING_IMPORTS.items():
        siblings = set()
        for name in imported_modules(folder / f"{module}.py", ROUTING):
            if name == ROUTING:
                siblings.add("__init__")
            elif name.startswith(ROUTING + "."):
                siblings.add(name[len(ROUTING) + 1:].split(".")[0])
        assert siblings <= allowed, f"capsnet/routing/{module}.py imports {sorted(siblings - allowed)}"


def public_names(path: Path) -> set:
    """The names a module defines at its top level without a leading underscore."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


def test_the_routing_package_exports_every_public_name_of_its_modules():
    """``capsnet.routing`` stands for all its modules (the old routing_algorithms and routing_layers too)."""
    folder = MODELS / "capsnet" / "routing"
    init = ast.parse((folder / "__init__.py").read_text())
    exported = next(ast.literal_eval(node.value) for node in init.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    imported = {alias.asname or alias.name for node in init.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    defined = set().union(*(public_names(path) for path in folder.glob("*.py") if path.name != "__init__.py"))
    assert defined - set(exported) == set(), "add these to capsnet/routing/__init__.py's imports and __all__"
    assert set(exported) - imported == set(), "__all__ names these, which capsnet/routing/__init__.py does not import"


def test_the_changelog_lists_every_old_module_path_with_its_new_one():
    import tinygrad_caps.models  # noqa: F401  (installs the models' old paths)
    from tinygrad_caps.kernels.moved import moved_modules

    changelog = (ROOT / "CHANGELOG.md").read_text()
    for old, new in moved_modules().items():
        assert f"| `{old}` | `{new}` |" in changelog, f"CHANGELOG.md does not list {old} -> {new}"


# A module path in a docstring, as ``code``: an old one (models/_moved.py) is written out with the
# package (``models.run_state``, ``tinygrad_caps.models.app.study_runner``) or by a name no module has
# any more (``study_runner``, ``commands.train.model_options``, ``distributed_training.X``).
GONE_MODULE_NAMES = {old.rpartition(".")[2] for old in MOVED} - (
    {path.stem for path in MODELS.rglob("*.py")} | {path.name for path in MODELS.rglob("*") if path.is_dir()})
# Old names still written in docstrings of modules another change of issue 42 owns (it rewrites them).
PENDING_OLD_NAMES: set = set()  # old names still waiting for their module to change (none left)


def old_module_names(text: str) -> list:
    """The module paths in ``text``'s ``code`` spans that are old ones (see GONE_MODULE_NAMES); a
    name followed by "(" is a call, not a module."""
    found = []
    for span in re.findall(r"``([^`]+)``|`([^`]+)`", text):
        name = re.match(r"[A-Za-z_][\w.]*(?!\w)", "".join(span).strip())
        if name is None or "".join(span).strip()[name.end():].startswith("("):
            continue
        name = name.group(0).rstrip(".")
        prefix = next((p for p in (f"{PACKAGE}.", "models.") if name.startswith(p)), None)
        if prefix is not None:
            parts = name[len(prefix):].split(".")
            old = any(".".join(parts[:k]) in MOVED for k in range(1, len(parts) + 1))
        else:
            old = name.split(".")[0] in GONE_MODULE_NAMES
        if old:
            found.append(name)
    return found


def docstrings(path: Path):
    """(where, docstring) of the module, every class and every function of ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node)
            if text:
                yield getattr(node, "name", "module docstring"), text


def test_the_old_name_finder_sees_each_way_of_naming_an_old_path():
    text = ("``models.run_state`` and ``tinygrad_caps.models.app.study_runner.train_runs``, ``study_summary``, "
            "``commands.train.model_options``; not ``models.app.training.run_state``, ``routing_layers()``, "
            "``trace.retain_grad()``, ``checkpoints``, ``gradflow.jsonl`` or ``training.reporting``")
    assert old_module_names(text) == ["models.run_state", f"{PACKAGE}.app.study_runner.train_runs",
                                      "study_summary", "commands.train.model_options"]


def test_no_docstring_names_an_old_module_path():
    """Docstrings of models/ and of the console script's launcher name modules by their new paths."""
    found = set()
    for path in [*sorted(MODELS.rglob("*.py")), ROOT / "tinygrad_caps_cli.py"]:
        for where, text in docstrings(path):
            found.update((path.relative_to(ROOT).as_posix(), name, where) for name in old_module_names(text))
    assert {(path, name, where) for path, name, where in found if (path, name) not in PENDING_OLD_NAMES} == set()


FIGURES_MODULE = f"{PACKAGE}.analysis.figures"
# the modules that show a statistic: each reads it from the figures registry, none keeps a list of its own
FIGURE_CONSUMERS = ("analysis/routing_statistics.py", "analysis/plots.py", "analysis/study_figures.py",
                    "app/cli/gradflow.py", "app/studies/registry.py", "app/studies/summary.py",
                    "app/training/tensorboard_log.py")


def test_the_figures_registry_imports_no_app_and_every_consumer_reads_it():
    imports = layer_imports("analysis")[FIGURES_MODULE]
    assert imports and all(m.split(".")[2] in ("analysis", "capsnet") for m in imports), sorted(imports)
    for consumer in FIGURE_CONSUMERS:
        path = MODELS / consumer
        package = module_name(path).rpartition(".")[0]
        assert FIGURES_MODULE in imported_modules(path, package), f"models/{consumer} does not read analysis.figures"
