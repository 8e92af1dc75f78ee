"""How the package is put together: the install maps the top-level kernels/ and models/ into
``tinygrad_caps``, so a clone that was never installed says what to run, and the install lists
every sub-package."""
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from paths import ROOT

# where each installed package's folder is (pyproject.toml's package-dir)
PACKAGE_DIRS = {"tinygrad_caps": "tinygrad_caps", "tinygrad_caps.kernels": "kernels", "tinygrad_caps.models": "models"}


def test_a_clone_without_the_install_says_in_one_line_what_to_run(tmp_path):
    # -S loads no site-packages, so neither the install nor its editable finder is seen; the
    # repository root comes first on the path, then NumPy's folder (tinygrad_caps needs NumPy).
    path = os.pathsep.join([str(ROOT), str(Path(numpy.__file__).resolve().parents[1])])
    result = subprocess.run([sys.executable, "-S", "-c", "import tinygrad_caps"], cwd=tmp_path, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tinygrad_caps.kernels is missing")
    assert "kernels/ and models/" in last and last.endswith("from the repository root, run: pip install -e .")


def test_the_install_lists_every_sub_package():
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for package, folder in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package,) + relative))
    assert found - listed == set(), "add these to pyproject.toml's packages"


def test_the_quick_loops_list_of_slow_files_names_files_that_exist():
    """SLOW_FILES and SLOW_TESTS (tests/support/slow_tests.py) name files (and tests) that exist: a renamed
    file would otherwise fall back into the quick loop unnoticed."""
    import re

    from paths import ROOT
    from slow_tests import SLOW_FILES, SLOW_TESTS

    TESTS = ROOT / "tests"

    for name in [*SLOW_FILES, *(key.split("::")[0] for key in SLOW_TESTS)]:
        assert (TESTS / name).is_file(), f"tests/conftest.py names {name}, which does not exist"
    for key in SLOW_TESTS:
        path, test = key.split("::")
        assert re.search(rf"^def {test}\(", (TESTS / path).read_text(), re.M), f"{key} does not exist"
