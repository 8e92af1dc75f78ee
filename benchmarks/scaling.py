"""Data-parallel scaling of CapsNet training: time per step and per gradient all-reduce, 1..N processes.

    python benchmarks/scaling.py [--processes 1 2] [--batch-per-rank 16] [--steps 4] [--json FILE]
    python benchmarks/scaling.py --device cuda --processes 1 2 4 8     # one GPU per process, NCCL

For each process count it starts ``mpirun -n N`` on this script in worker mode. Every rank trains
the paper's CapsNet (8.2M parameters, float32) under DistributedDataParallel on synthetic images
with ``--batch-per-rank`` images each (weak scaling: the global batch grows with N), and times
(a) one training step (forward, backward with the bucketed all-reduces, Adam), the slowest rank's
time, median over ``--steps`` after one warm-up step, and (b) one all-reduce of an 8.2M-element
float32 buffer (CapsNet's gradient) on its own. Efficiency = throughput(N) / (N * throughput(1)).
On CPUs each process runs one BLAS thread, so N processes need N cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CAPSNET_GRADIENT_ELEMENTS = 8_215_568


def worker(args) -> None:
    import tinygrad_caps as tc
    import tinygrad_caps.distributed as dist
    from _steps import random_batch, seeded_capsnet, training_step

    dist.init(backend="auto", device=args.device)
    device = tc.backend.normalize_device(args.device)
    sync = (lambda: tc.backend.cupy_module().cuda.get_current_stream().synchronize()) if device == "cuda" else (lambda: None)
    model = seeded_capsnet(device)
    parameters = sum(p.size for p in model.parameters())
    ddp = dist.DistributedDataParallel(model, bucket_mb=args.bucket_mb)
    images, y = random_batch(args.batch_per_rank, seed=dist.rank())  # each rank its own images
    _, train = training_step(model, tc.tensor(images, device=device), y, forward=ddp)  # labels stay on the host

    def step():
        train()
        sync()

    step_times = _timed(step, args.steps, sync)
    flat = tc.backend.module_for(device).ones(CAPSNET_GRADIENT_ELEMENTS, dtype=np.float32)
    reduce_times = _timed(lambda: (dist.all_reduce(flat), sync()), max(args.steps, 5), sync)
    if dist.rank() == 0:
        print("RESULT " + json.dumps({
            "processes": dist.world_size(), "backend": dist.get_backend(), "device": device,
            "parameters": parameters, "buckets": len(ddp.buckets), "batch_per_rank": args.batch_per_rank,
            "step_seconds": statistics.median(step_times), "all_reduce_seconds": statistics.median(reduce_times)}),
            flush=True)
    dist.finalize()


def _timed(fn, repeat, sync):
    """Seconds of ``fn`` on the slowest rank (ranks start together), after one warm-up call."""
    import tinygrad_caps.distributed as dist

    fn()
    samples = []
    for _ in range(repeat):
        sync()
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = np.array([time.perf_counter() - start])
        samples.append(float(dist.all_reduce(elapsed, op="max")[0]))
    return samples


def driver(args) -> list:
    from tinygrad_caps.distributed.launch import mpirun_command

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows = []
    for n in args.processes:
        command = mpirun_command(n) + [sys.executable, os.path.abspath(__file__), "--worker", "--device", args.device,
                                       "--batch-per-rank", str(args.batch_per_rank), "--steps", str(args.steps),
                                       "--bucket-mb", str(args.bucket_mb)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{n} processes failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        rows.append(json.loads(lines[0][len("RESULT "):]))
    base = rows[0]["batch_per_rank"] / rows[0]["step_seconds"] / rows[0]["processes"]
    for row in rows:
        row["images_per_second"] = row["processes"] * row["batch_per_rank"] / row["step_seconds"]
        row["efficiency"] = row["images_per_second"] / (row["processes"] * base)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-per-rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bucket-mb", type=float, default=25)
    parser.add_argument("--device", default="cpu", help="cpu (MPI) or cuda (NCCL, one GPU per process)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per process count")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    rows = driver(args)
    print(f"CapsNet ({rows[0]['parameters']:,} parameters, float32), {args.batch_per_rank} images per process, "
          f"{rows[0]['device']}, backend {rows[0]['backend']}, {rows[0]['buckets']} bucket(s) of {args.bucket_mb} MB")
    print("| processes | step (s) | images/s | efficiency vs linear | all-reduce of 8.2M floats (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['processes']} | {r['step_seconds']:.3f} | {r['images_per_second']:.1f} | {r['efficiency']:.2f} | "
              f"{1000 * r['all_reduce_seconds']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
