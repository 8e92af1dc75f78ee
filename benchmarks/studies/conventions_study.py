"""Conventions study: the paper's equations against the official code's conventions, with the full
and the detached routing gradient, on the same data and budget.

For each of the four configurations it trains the README's reduced CapsNet for one pass over the
same Fashion-MNIST images and records the test accuracy and, at initialization and after
training, the norms of the gradient reaching ``digit.weight`` from the margin term and from the
weighted reconstruction term of the loss (and the margin term's share of the squared norm).

    python benchmarks/studies/conventions_study.py --out /tmp/conventions
    python benchmarks/studies/conventions_study.py --train-images 200 --test-images 100 --out /tmp/c

Writes ``conventions_study.json``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet
from tinygrad_caps.models.analysis.study_figures import gradient_shares
from tinygrad_caps.models.app.studies import add_study_options, study_data, test_accuracy, train_images


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-images", type=int, default=3000)
    add_study_options(p)
    p.add_argument("--out", default="runs/conventions_study")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    (train_x, train_y), (test_x, test_y), (stats_x, stats_y) = study_data(args, args.train_images)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for conventions in ("paper", "official"):
        for gradient in ("full", "detach"):
            tc.manual_seed(args.seed)
            model = CapsNet(conventions=conventions, routing_gradient=gradient, routing_iterations=args.iterations,
                            conv1_channels=args.conv1_channels, primary_types=args.primary_types)
            started = time.perf_counter()
            initial = gradient_shares(model, stats_x, stats_y)
            loss = train_images(model, train_x, train_y, args.batch_size, args.lr, args.seed)
            accuracy = test_accuracy(model, test_x, test_y)
            trained = gradient_shares(model, stats_x, stats_y)
            row = {"conventions": conventions, "routing_gradient": gradient, "train_loss": loss,
                   "test_accuracy": accuracy, "initial": initial, "trained": trained,
                   "seconds": time.perf_counter() - started}
            results.append(row)
            print(f"{conventions:8} {gradient:6} acc {accuracy:.3f} loss {loss:.4f} | digit.weight margin share "
                  f"init {initial['margin_share']:.3f} trained {trained['margin_share']:.3f} | "
                  f"{row['seconds']:.0f}s", flush=True)
    report = {"train_images": len(train_y), "test_images": len(test_y), "options": vars(args),
              "results": results}
    (out / "conventions_study.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'conventions_study.json'}")
    return report


if __name__ == "__main__":
    main()
