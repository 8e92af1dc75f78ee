"""Peak memory of one CapsNet training step (forward, backward, Adam), ours against PyTorch.

Each (implementation, batch) runs in a fresh subprocess, so peaks never mix: the peak resident
set size from ``resource.getrusage`` (the whole process: interpreter, libraries, arrays), the
peak RSS growth over the process before the step (what the step itself needs), and, for ours,
tracemalloc's peak of NumPy's allocations during the step. The model is the paper's full CapsNet
in float32; the step is run twice (the second, steady-state step is the one measured). Both run
with the allocator tuned (``tc.tune_allocator()``), as training does.

    python benchmarks/memory.py [--batch 32 100] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

from _timing import say_pytorch_missing

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, resource, sys, tracemalloc
sys.path.insert(0, {here!r})
impl, batch = {impl!r}, {batch}
import tinygrad_caps as tc
tc.tune_allocator()
from _steps import random_batch, seeded_capsnet, torch_training_step, training_step
x, y = random_batch(batch)

def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

if impl == "ours":
    model = seeded_capsnet()
    _, step = training_step(model, tc.tensor(x), y)
else:
    import torch
    from torch_capsnet import TorchCapsNet
    torch.manual_seed(0)
    model = TorchCapsNet()
    step = torch_training_step(model, torch.from_numpy(x), torch.from_numpy(y))

before = peak_rss_bytes()
step()  # the first step allocates optimizer state and gradients
after_first = peak_rss_bytes()
tracemalloc.start()
step()
traced_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
print(json.dumps({{"impl": impl, "batch": batch, "peak_rss_mb": peak_rss_bytes() / 2**20,
                  "step_rss_growth_mb": (peak_rss_bytes() - before) / 2**20,
                  "tracemalloc_peak_mb": traced_peak / 2**20 if impl == "ours" else None}}))
"""


def measure(impl: str, batch: int) -> dict:
    """Run one (implementation, batch) in a fresh interpreter; returns its memory figures."""
    code = CHILD.format(here=HERE, impl=impl, batch=batch)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{impl} B={batch} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 100])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401

        impls = ["ours", "torch"]
    except ImportError:
        impls = ["ours"]
        say_pytorch_missing(args.json)
    rows = []
    for batch in args.batch:
        row = {"batch": batch}
        for impl in impls:
            row[impl] = measure(impl, batch)
        if "torch" in row:
            row["peak_rss_ratio"] = row["ours"]["peak_rss_mb"] / row["torch"]["peak_rss_mb"]
            row["step_growth_ratio"] = row["ours"]["step_rss_growth_mb"] / row["torch"]["step_rss_growth_mb"]
        rows.append(row)
    info = {"machine": platform.processor() or platform.machine(), "python": platform.python_version()}
    if args.json:
        print(json.dumps({"info": info, "rows": rows}, indent=2))
        return
    print(f"CapsNet training step, peak memory ({info['machine']})")
    print(f"{'B':>4} {'impl':>6} {'peak RSS MB':>12} {'step growth MB':>15} {'tracemalloc MB':>15}")
    for row in rows:
        for impl in impls:
            r = row[impl]
            traced = f"{r['tracemalloc_peak_mb']:.0f}" if r["tracemalloc_peak_mb"] is not None else "-"
            print(f"{row['batch']:>4} {impl:>6} {r['peak_rss_mb']:>12.0f} {r['step_rss_growth_mb']:>15.0f} {traced:>15}")
        if "peak_rss_ratio" in row:
            print(f"{'':>4} {'ratio':>6} {row['peak_rss_ratio']:>12.2f} {row['step_growth_ratio']:>15.2f}")


if __name__ == "__main__":
    main()
