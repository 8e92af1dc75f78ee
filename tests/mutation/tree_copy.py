"""A self-contained copy of the working tree for planting bugs, and the environment to test it in."""
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
IGNORED = (".git", "runs", "__pycache__", ".hypothesis", ".pytest_cache", "*.egg-info", "mutants", "*.sqlite")


def environment(tree) -> dict:
    """os.environ with the copy first on the import path and no bytecode written (a planted bug and
    its restored original can share a size and an mtime second, so a cached .pyc could outlive either;
    TINYGRAD_CAPS_BYTECODE=off keeps tests/conftest.py from turning a bytecode cache on)."""
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "TINYGRAD_CAPS_BYTECODE": "off"}


def copy_tree(destination) -> pathlib.Path:
    """Copy the tree to ``destination`` and make the copy import from itself.

    The package maps ``tinygrad_caps.models`` and ``tinygrad_caps.kernels`` onto the top-level
    folders models/ and kernels/; an editable install resolves them to the original tree, so the
    copy links them into its own tinygrad_caps/ (found first through PYTHONPATH). Raises
    RuntimeError if the copy still imports anything from elsewhere.
    """
    destination = pathlib.Path(destination)
    shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(*IGNORED))
    for sub in ("models", "kernels"):
        link = destination / "tinygrad_caps" / sub
        if not link.exists():
            link.symlink_to(pathlib.Path("..") / sub, target_is_directory=True)
    code = ("import tinygrad_caps as t, tinygrad_caps.models as m, tinygrad_caps.kernels as k; "
            "print(t.__file__, m.__file__, k.__file__)")
    check = subprocess.run([sys.executable, "-c", code], cwd=destination, capture_output=True, text=True,
                           env=environment(destination))
    files = check.stdout.split()
    if check.returncode != 0 or len(files) != 3 or not all(f.startswith(str(destination)) for f in files):
        raise RuntimeError(f"the copy does not import from itself: {check.stdout}{check.stderr}")
    return destination
