"""Run pytest as the README installs the project, without PyTorch, even where it is installed.

    python tests/mutation/without_torch.py -q tests/models/test_fixtures.py
    python tests/mutation/without_torch.py --hide cupy -q tests/engine/test_conv.py   # and no CuPy either

``import torch`` raises ModuleNotFoundError (so ``pytest.importorskip("torch")`` skips); every
argument after the optional ``--hide NAME`` pairs goes to pytest unchanged. The exit status is pytest's.
"""
import importlib.abc
import sys

import pytest

BLOCKED = {"torch", "torchvision"}


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: running without PyTorch)", name=name)
        return None


def main(argv):
    while argv[:1] == ["--hide"]:
        BLOCKED.add(argv[1])
        argv = argv[2:]
    sys.meta_path.insert(0, _Blocker())
    return int(pytest.main(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
