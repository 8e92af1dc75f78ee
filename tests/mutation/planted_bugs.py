"""Plant each bug that once passed the suite unnoticed, one at a time, in a copy of the tree, and
check that the tests fail on it without PyTorch.

    python tests/mutation/planted_bugs.py                 # each bug against the fast selection below
    python tests/mutation/planted_bugs.py --all-tests     # each bug against the whole suite

The copy lives in a temporary folder; the working tree is never modified. Exit status 1 if any
bug survives or can no longer be planted (its line changed: update the bug here).
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

from tree_copy import ROOT, copy_tree, environment

# (name, file, the correct text, the buggy text)
BUGS = [
    ("routing logits replaced by the last agreement", "models/capsnet/routing/dynamic.py",
     "logits = logits + a\n", "logits = a\n"),
    ("default reconstruction weight 0.0005 -> 0.005", "models/capsnet/losses.py",
     "DEFAULT_RECONSTRUCTION_WEIGHT = 0.0005", "DEFAULT_RECONSTRUCTION_WEIGHT = 0.005"),
    ("SGD Nesterov uses the gradient twice", "tinygrad_caps/optim/optimizer.py",
     "grad = grad + self.momentum * buf if self.nesterov else buf",
     "grad = grad + self.momentum * grad if self.nesterov else buf"),
    ("AdamW decay not scaled by lr", "tinygrad_caps/optim/optimizer.py",
     "param *= 1 - self.lr * self.weight_decay", "param *= 1 - self.weight_decay"),
    ("AMSGrad maximum computed but unused", "tinygrad_caps/optim/optimizer.py",
     'v = state["max_exp_avg_sq"]', 'v = v'),
    ("col2im batch-innermost column slice with the row stride", "tinygrad_caps/ops/conv.py",
     "out[:, i:i + sh * oh:sh, j:j + sw * ow:sw, :] += patches[:, i, j]",
     "out[:, i:i + sh * oh:sh, j:j + sw * ow:sh, :] += patches[:, i, j]"),
    ("conv_transpose2d width uses output_padding[0]", "tinygrad_caps/ops/conv.py",
     "ow = (w - 1) * stride[1] - 2 * padding[1] + kw + extra[1]",
     "ow = (w - 1) * stride[1] - 2 * padding[1] + kw + extra[0]"),
]

FAST_TESTS = ["tests/models/test_routing_reference.py", "tests/models/test_fixtures.py", "tests/app/test_defaults.py",
              "tests/engine/test_conv.py", "tests/engine/test_forward_values.py"]


def run_tests(tree, tests):
    command = [sys.executable, "tests/mutation/without_torch.py", "-q", "-x", "-p", "no:cacheprovider", *tests]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True, env=environment(tree))
    lines = result.stdout.strip().splitlines()
    failed = [line.split(" - ")[0] for line in lines if line.startswith("FAILED ")]
    return result.returncode, failed[:1] or lines[-1:] or [""]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all-tests", action="store_true", help="run the whole suite for each bug")
    args = parser.parse_args(argv)
    tests = ["tests"] if args.all_tests else [t for t in FAST_TESTS if (ROOT / t).exists()]
    failures = 0
    with tempfile.TemporaryDirectory(prefix="planted-") as folder:
        tree = pathlib.Path(folder) / "tree"
        copy_tree(tree)
        status, last = run_tests(tree, tests)
        print(f"{'clean tree':55s} {'passes' if status == 0 else 'FAILS'}: {last[0]}")
        if status != 0:
            return 1
        for name, path, good, bad in BUGS:
            target = tree / path
            text = target.read_text()
            if text.count(good) != 1:
                print(f"{name:55s} CANNOT PLANT: {good!r} occurs {text.count(good)} times in {path}")
                failures += 1
                continue
            target.write_text(text.replace(good, bad))
            try:
                status, last = run_tests(tree, tests)
            finally:
                target.write_text(text)
            caught = status not in (0, 5)
            failures += not caught
            print(f"{name:55s} {'caught' if caught else 'SURVIVES'}: {last[0]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
