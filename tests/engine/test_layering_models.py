"""The layers of models/ import only downward: capsnet (the network family) imports neither analysis
nor app, analysis does not import app, and nothing under tinygrad_caps/ imports models. Read from the
source with ``ast``, so an import inside a function counts too; an old module name (models/_moved.py)
counts as the module it now names."""
import ast
from pathlib import Path

import pytest

from paths import ROOT
from tinygrad_caps.models._moved import MOVED

MODELS = ROOT / "models"
PACKAGE = "tinygrad_caps.models"


def module_name(path: Path) -> str:
    """models/app/cli.py -> tinygrad_caps.models.app.cli (a package's __init__ is the package)."""
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
    """An old flat module name as the module it now names; ``models.X`` (the source folder) as ``tinygrad_caps.models.X``."""
    if name == "models" or name.startswith("models."):
        name = PACKAGE + name[len("models"):]
    parts = name.split(".")
    if name.startswith(PACKAGE + ".") and len(parts) > 2 and parts[2] in MOVED:
        name = ".".join([PACKAGE, MOVED[parts[2]], *parts[3:]])
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


def test_the_engine_imports_no_models():
    for path in sorted((ROOT / "tinygrad_caps").rglob("*.py")):
        package = ".".join(("tinygrad_caps", *path.relative_to(ROOT / "tinygrad_caps").with_suffix("").parts))
        if path.name != "__init__.py":
            package = package.rpartition(".")[0]
        imports = imported_modules(path, package)
        assert not {m for m in imports if m.startswith(PACKAGE) or m == "models" or m.startswith("models.")}, path


def test_the_checker_sees_an_upward_import(tmp_path):
    """The resolution of relative imports and old names, on imports that would break the layering."""
    module = tmp_path / "m.py"
    module.write_text("from ..app.training import train\nfrom .. import training\nfrom ..plots import pyplot\n")
    assert imported_modules(module, f"{PACKAGE}.capsnet") >= {
        f"{PACKAGE}.app.training", f"{PACKAGE}.app.training.train", f"{PACKAGE}.analysis.plots"}
