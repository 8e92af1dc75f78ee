"""Run pytest as the README installs the project, without PyTorch, even where it is installed.

    python tests/mutation/without_torch.py -q tests/models/test_fixtures.py
    python tests/mutation/without_torch.py --hide cupy -q tests/engine/test_conv.py   # and no CuPy either

``import torch`` raises ModuleNotFoundError (so ``pytest.importorskip("torch")`` skips); every
argument after the optional ``--hide NAME`` pairs goes to pytest unchanged. The exit status is pytest's.
"""
import sys

import pytest

BLOCKED = {"torch", "torchvision"}


def hide(names) -> None:
    """Make ``names`` look not installed in this process: ``import`` raises ModuleNotFoundError and
    ``importlib.util.find_spec`` answers None, as where they are missing."""
    for name in names:
        sys.modules[name] = None


def main(argv):
    while argv[:1] == ["--hide"]:
        BLOCKED.add(argv[1])
        argv = argv[2:]
    hide(BLOCKED)
    return int(pytest.main(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
