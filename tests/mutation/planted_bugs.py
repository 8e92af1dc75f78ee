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
     "            v = max_v\n", "            v = v\n"),
    ("col2im batch-innermost column slice with the row stride", "tinygrad_caps/ops/conv.py",
     "phase[:, i // sh:i // sh + oh, j // sw:j // sw + ow, :] += patches[start:stop, i, j]",
     "phase[:, i // sh:i // sh + oh, j // sh:j // sh + ow, :] += patches[start:stop, i, j]"),
    ("conv_transpose2d width uses output_padding[0]", "tinygrad_caps/ops/conv.py",
     "ow = (w - 1) * stride[1] - 2 * padding[1] + kw + extra[1]",
     "ow = (w - 1) * stride[1] - 2 * padding[1] + kw + extra[0]"),
    ("Welch interval with Student's pooled n_a + n_b - 2 df", "models/analysis/confidence.py",
     'df = (va + vb) ** 2 / (va ** 2 / (a["n"] - 1) + vb ** 2 / (b["n"] - 1))', 'df = a["n"] + b["n"] - 2'),
    ("from_dlpack of a Tensor without its version counter", "tinygrad_caps/dlpack.py",
     "        shared._vc = obj._shared_version_counter()\n", ""),
    ("from_dlpack(copy=True) of a Tensor shares its memory", "tinygrad_caps/dlpack.py",
     "return leaf(obj.data.copy(), requires_grad=requires_grad)", "return leaf(obj.data, requires_grad=requires_grad)"),
    ("from_dlpack(copy=True) of an array shares its memory", "tinygrad_caps/dlpack.py",
     "return np.from_dlpack(obj, copy=copy)", "return np.from_dlpack(obj)"),
    ("softmax create_graph backward sums over the last axis", "tinygrad_caps/ops/activation.py",
     "return y * (gy - reduce_sum(gy * y, self.axis, keepdims=True))",
     "return y * (gy - reduce_sum(gy * y, -1, keepdims=True))"),
]

FAST_TESTS = ["tests/models/test_routing_reference.py", "tests/models/test_fixtures.py", "tests/app/test_defaults.py",
              "tests/engine/test_conv.py", "tests/engine/test_forward_values.py",
              "tests/models/test_confidence.py", "tests/engine/test_dlpack_own_tensors.py",
              "tests/engine/test_grad_nn_ops.py"]


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
