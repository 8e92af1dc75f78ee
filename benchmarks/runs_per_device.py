"""How much of one GPU a study gets from several runs on it (``study run --runs-per-device K``): K
processes, each training a CapsNet on batches of ``--batch`` with its step captured as a CUDA graph
(as ``train`` does on a GPU), start together and train for ``--seconds``; the table gives the images
per second of each run and of the whole GPU for every K, and the ratio to K = 1, for each ``--model``:
the paper's (``full``) and the README's reduced one (``reduced``, the studies' default: 64 conv1
channels, 16 primary capsule types), whose step leaves more of the GPU to the others.

    python benchmarks/runs_per_device.py [--device cuda:0] [--model full [reduced]] [--runs 1 2 4]
                                         [--batch 100] [--seconds 20] [--json]

Each run is a process of its own (as the local executor's workers are), so the runs share the GPU
the way a study's runs do. On the CPU (``--device cpu``) the step is eager and the figures say how
the cores are shared instead (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def worker(device: str, batch: int, seconds: float, start_at: float, model_name: str = "full") -> dict:
    """Build the step of ``model_name`` (_steps.MODELS; captured on a GPU), wait for ``start_at``
    (time.time()), train for ``seconds``; returns {"steps", "seconds", "images_per_second"}."""
    import tinygrad_caps as tc
    from _steps import MODELS, model_batch, seeded_capsnet, training_step

    with tc.backend.on_device(device):
        model = seeded_capsnet(device, **MODELS[model_name])
        x, y = model_batch(batch, MODELS[model_name])
        xt, yt = tc.tensor(x, device=device), tc.tensor(y, device=device)
        on_gpu = device != "cpu"
        _, step = training_step(model, xt, yt.data, capturable=on_gpu)
        if on_gpu:
            from tinygrad_caps.cuda_graphs import CapturedStep

            runner = CapturedStep(step, (xt, yt), warmup=2)
            arrays = [xt.data, yt.data]
            run_step = lambda: runner(*arrays)  # noqa: E731
            finish = runner.synchronize
        else:
            run_step, finish = step, (lambda: None)
        for _ in range(3):  # warm-up (and, on a GPU, the capture)
            run_step()
        finish()
        time.sleep(max(0.0, start_at - time.time()))
        began, steps = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            run_step()
            steps += 1
            if steps % 10 == 0:
                finish()
        finish()
        elapsed = time.perf_counter() - began
    return {"steps": steps, "seconds": elapsed, "images_per_second": steps * batch / elapsed}


def measure(device: str, runs: int, batch: int, seconds: float, setup_seconds: float, model: str = "full") -> list:
    """Start ``runs`` worker processes of ``model`` together on ``device``; returns their results."""
    start_at = time.time() + setup_seconds
    here = os.path.dirname(os.path.abspath(__file__))
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--device", device, "--batch", str(batch),
               "--seconds", str(seconds), "--start-at", repr(start_at), "--model", model]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=here) for _ in range(runs)]
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=setup_seconds + seconds + 600)
        if process.returncode != 0:
            raise SystemExit(f"a run process failed (exit {process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main(argv=None) -> int:
    """Measure every ``--runs`` count; print the table (or ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--model", nargs="+", choices=["full", "reduced", "tiny"], default=["full"],
                        help="the CapsNets to measure, one after another (default: the paper's; tiny: for smoke tests)")
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--setup-seconds", type=float, default=60.0,
                        help="time the processes get to build and capture their steps before they start together")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.device, args.batch, args.seconds, args.start_at, args.model[0])))
        return 0
    rows = []
    for model in args.model:
        first = None
        for runs in args.runs:
            results = measure(args.device, runs, args.batch, args.seconds, args.setup_seconds, model)
            total = sum(r["images_per_second"] for r in results)
            first = first or total
            rows.append({"model": model, "runs": runs, "per_run": [r["images_per_second"] for r in results],
                         "total": total, "ratio_to_first": total / first})
    if args.json:
        print(json.dumps({"device": args.device, "batch": args.batch, "seconds": args.seconds, "rows": rows}))
        return 0
    print(f"runs per device on {args.device}, batch {args.batch}, {args.seconds:g} s each:")
    print("| model | runs | images/s per run | images/s of the device | ratio to the first |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        per_run = ", ".join(f"{v:.0f}" for v in row["per_run"])
        print(f"| {row['model']} | {row['runs']} | {per_run} | {row['total']:.0f} | {row['ratio_to_first']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
