"""The import graph keeps its layers: models -> engine -> kernels, never upward.

Every .py file under a folder of RULES is parsed (``ast``, nothing is imported) and each import it
makes, relative ones resolved to the installed name, is checked against that folder's forbidden
module prefixes. A rule for a sub-folder is one more row, e.g.
``("models/analysis", ("tinygrad_caps.models.app",), ())``.
"""
import ast
import os
import sys
from pathlib import Path

import pytest

from paths import ROOT

# the installed package of each top-level folder (pyproject.toml's package-dir)
PACKAGE_OF = {"tinygrad_caps": "tinygrad_caps", "kernels": "tinygrad_caps.kernels", "models": "tinygrad_caps.models"}

# (folder, module prefixes its files must not import, prefixes allowed inside those)
RULES = [
    ("kernels", ("tinygrad_caps",), ("tinygrad_caps.kernels",)),  # the kernels deal in arrays only
    ("tinygrad_caps", ("tinygrad_caps.models",), ()),               # the engine knows no model
    # the models reach the kernels only through the engine (its re-exports, e.g. ops.linalg.PRECISIONS),
    # but for the one mechanism of old paths and names every layer shares
    ("models", ("tinygrad_caps.kernels",), ("tinygrad_caps.kernels.moved",)),
]


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _package_of(path: Path) -> str:
    """The installed name of the package that holds ``path``."""
    top, *rest = path.relative_to(ROOT).parent.parts
    return ".".join([PACKAGE_OF[top], *rest])


def imported_modules(path: Path):
    """(line, module) for every module ``path`` imports, ``from a import b`` giving both a and a.b."""
    package = _package_of(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def python_files(folder: str):
    for directory, _, files in os.walk(ROOT / folder):  # symbolic links to folders are not followed
        yield from (Path(directory) / f for f in sorted(files) if f.endswith(".py"))


@pytest.mark.parametrize("folder, forbidden, allowed", RULES, ids=[rule[0] for rule in RULES])
def test_no_file_imports_across_its_layer(folder, forbidden, allowed):
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for path in python_files(folder)
             for line, module in imported_modules(path)
             if _within(module, forbidden) and not _within(module, allowed)]
    assert found == []


def test_the_check_sees_relative_and_absolute_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "kernels" / "checking").mkdir(parents=True)
    sample = tmp_path / "kernels" / "checking" / "sample.py"
    sample.write_text("from .. import launch\nfrom ... import autograd\nimport tinygrad_caps.tensor\n"
                      "def f():\n    from tinygrad_caps import models\n")
    modules = [m for _, m in imported_modules(sample)]
    assert modules == ["tinygrad_caps.kernels", "tinygrad_caps.kernels.launch", "tinygrad_caps",
                       "tinygrad_caps.autograd", "tinygrad_caps.tensor", "tinygrad_caps", "tinygrad_caps.models"]
    assert [m for m in modules if _within(m, ("tinygrad_caps",)) and not _within(m, ("tinygrad_caps.kernels",))] == [
        "tinygrad_caps", "tinygrad_caps.autograd", "tinygrad_caps.tensor", "tinygrad_caps", "tinygrad_caps.models"]
