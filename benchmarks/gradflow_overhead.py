"""The cost of ``train --log-gradflow 1``: one training step (forward, backward, Adam) with and without
recording the routing traces, retaining their gradients, computing the statistics and writing the
JSON line, on real Fashion-MNIST batches. Plain and logged steps alternate so that load from other
processes hits both alike; the figures are the ratios of the medians of the wall time and of the
process CPU time (all threads; the steadier of the two on a shared machine).

    python benchmarks/gradflow_overhead.py [--steps 20] [--batch 100] [--conv1-channels 64] [--primary-types 16]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.data import dataset_spec
from tinygrad_caps.models.app.training.gradflow_log import GradflowLog
from tinygrad_caps.models.app.training.trainer import batch_losses
from tinygrad_caps.models.capsnet import DEFAULT_RECONSTRUCTION_WEIGHT, CapsNet


def one_step(model, optimizer, x, y, log=None, step=0):
    traces = [] if log is not None else None
    started, cpu_started = time.perf_counter(), time.process_time()
    loss, _, _, _ = batch_losses(model, x, y, DEFAULT_RECONSTRUCTION_WEIGHT, train=True, traces=traces)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if log is not None:
        log.write(1, step, step, model.digit.gradient, traces)
    return time.perf_counter() - started, time.process_time() - cpu_started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of each kind (after 2 warm-up steps)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--conv1-channels", type=int, default=64)
    parser.add_argument("--primary-types", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    spec = dataset_spec("fashion-mnist")
    images, labels = spec.load("train")
    tc.manual_seed(0)
    model = CapsNet(conv1_channels=args.conv1_channels, primary_types=args.primary_types,
                    routing_iterations=args.iterations)
    optimizer = tc.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    plain, logged = [], []
    with tempfile.TemporaryDirectory() as folder:
        log = GradflowLog(Path(folder) / "gradflow.jsonl", every=1)
        for k in range(args.steps + 2):
            rows = rng.choice(len(labels), args.batch, replace=False)
            x, y = spec.preprocess(images[rows]), labels[rows]
            t_plain = one_step(model, optimizer, x, y)
            t_logged = one_step(model, optimizer, x, y, log, k + 1)
            if k >= 2:
                plain.append(t_plain)
                logged.append(t_logged)
    plain, logged = np.array(plain), np.array(logged)
    result = {"batch": args.batch, "conv1_channels": args.conv1_channels, "primary_types": args.primary_types,
              "routing_iterations": args.iterations, "steps": args.steps}
    for column, name in ((0, "wall"), (1, "cpu")):
        median_plain, median_logged = float(np.median(plain[:, column])), float(np.median(logged[:, column]))
        result.update({f"median_step_{name}_s": median_plain, f"median_logged_step_{name}_s": median_logged,
                       f"overhead_{name}": median_logged / median_plain - 1.0})
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
