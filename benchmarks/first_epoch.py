"""The first training epoch on a fresh machine (CuPy's kernel cache empty) and on a warm one, each
run in a process of its own (``tinygrad-caps train --epochs 1`` on Fashion-MNIST, B=100, on a GPU):

    cold-lazy  an empty CUPY_CACHE_DIR, the first-launch warm-up off (TINYGRAD_CAPS_KERNEL_WARM_UP=0):
               each kernel module compiles at its own first launch, one after another (as before)
    cold       an empty CUPY_CACHE_DIR: every module compiles at the first launch, in parallel
    warm       the cache the cold run left: a second run on the same machine

(Each cold run also starts with an empty kernel tuning cache, TINYGRAD_CAPS_TUNE_DIR, so its first
steps measure the kernels' variants; the warm run reuses the cold run's choices.)

Per run: the epoch's training seconds (metrics.jsonl: the batches, compiles included, not the test
pass), the process's wall seconds, and the files it added to the kernel cache (our modules and
CuPy's own elementwise and reduction kernels, which CuPy compiles at their first use).

    python benchmarks/first_epoch.py [--device cuda] [--data-dir data] [--batch-size 100]
                                     [--runs cold-lazy cold warm] [--json]    (warm needs cold)

Without the four Fashion-MNIST files in DATA_DIR/fashion-mnist, random images of the same shapes are
written to a temporary folder and used instead (said in the output: compile times and step times do
not depend on the pixels). Needs a GPU: on a machine without one it says so and exits with 2.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("cold-lazy", "cold", "warm")
TRAIN_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def dataset(data_dir: Path, scratch: Path) -> tuple[str, Path, str]:
    """(dataset name, data dir, "fashion-mnist" or "synthetic"): Fashion-MNIST where its files are,
    else random uint8 images (60,000 + 10,000, 28x28, 10 classes) written under ``scratch``."""
    folder = data_dir / "fashion-mnist"
    if all(any((folder / f"{stem}{ext}").exists() for ext in ("", ".gz")) for stem in TRAIN_FILES):
        return "fashion-mnist", data_dir, "fashion-mnist"
    from tinygrad_caps.data.idx import write_idx

    rng = np.random.default_rng(0)
    target = scratch / "synthetic-fashion"
    target.mkdir(parents=True)
    for prefix, n in (("train", 60000), ("t10k", 10000)):
        write_idx(target / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(target / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
    return "synthetic-fashion", scratch, "synthetic"


def one_run(name: str, cache: Path, data: tuple, args, scratch: Path) -> dict:
    """Train one epoch in a new process with CuPy's kernel cache in ``cache``; its figures."""
    # the kernel tuning cache (kernels/tune.py) empty with CuPy's in a cold run, and kept with it for the warm one
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache), TINYGRAD_CAPS_TUNE_DIR=str(cache) + "-tune",
               TINYGRAD_CAPS_KERNEL_WARM_UP="0" if name == "cold-lazy" else "1")
    out = scratch / f"run-{name}"
    command = [sys.executable, "-m", "tinygrad_caps.models.cli", "train", "--dataset", data[0], "--data-dir",
               str(data[1]), "--epochs", "1", "--batch-size", str(args.batch_size), "--limit-test", "1000",
               "--device", args.device, "--no-progress", "--out", str(out)]
    before = set(os.listdir(cache)) if cache.is_dir() else set()
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"first_epoch.py: the {name} run failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    added = set(os.listdir(cache)) - before if cache.is_dir() else set()
    return {"run": name, "epoch_seconds": round(line["seconds"], 3), "process_seconds": round(wall, 3),
            "new_cache_files": len(added), "train_accuracy": line["train_accuracy"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if "warm" in args.runs and "cold" not in args.runs:
        parser.error("the warm run reuses the cache of the cold run: ask for both")
    import tinygrad_caps as tc
    from tinygrad_caps.backend import _gpu_status

    if not args.device.startswith("cuda"):
        parser.error(f"the first epoch is timed on a GPU (--device cuda or cuda:N), not {args.device!r}")
    if not tc.gpu_available():
        print(f"first_epoch.py needs a GPU: {_gpu_status()[1]}", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="first-epoch-"))
    try:
        data = dataset(args.data_dir, scratch)
        synthetic = "; random images of Fashion-MNIST's shapes" if data[2] == "synthetic" else ""
        print(f"data: {data[2]} ({data[1]}){synthetic}")
        caches = {"cold-lazy": scratch / "cache-lazy", "cold": scratch / "cache", "warm": scratch / "cache"}
        rows = []
        for name in sorted(args.runs, key=RUNS.index):  # warm after cold
            rows.append(one_run(name, caches[name], data, args, scratch))
            row = rows[-1]
            print(f"{name:>9}: epoch {row['epoch_seconds']:7.2f} s, process {row['process_seconds']:7.2f} s, "
                  f"{row['new_cache_files']:3d} new kernel cache files")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps({"device": args.device, "batch_size": args.batch_size, "data": data[2], "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
