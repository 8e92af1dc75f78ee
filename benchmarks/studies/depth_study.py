"""Depth study: do deeper stacks of routing layers train, with and without a capsule bias?

For 0 to 4 hidden capsule layers of (32, 12) (Peer, Stabinger & Rodriguez-Sanchez 2019), with and
without ``capsule_bias``, with the ``full`` and ``detach`` routing gradient, trains the README's
reduced CapsNet for the same budget on Fashion-MNIST and records the test accuracy and, at
initialization and after training, per routing layer: the gradient norm reaching its weight, the
coupling entropy and the D-score of its last routing iteration.

    python benchmarks/studies/depth_study.py --out /tmp/depth            # the default budget
    python benchmarks/studies/depth_study.py --budget 0.1 --out /tmp/d   # a tenth of it

``--budget`` scales the number of training images of every configuration (default 1.0: 3,000
images, one pass).
``--capsule-init peer`` replaces the routing layers' initialization by that of Peer et al.'s code
(weights N(0, 0.2), bias 0.1) to separate the effect of the bias from that of its initial value. Writes
``depth_study.json`` and, with matplotlib (the viz extra), ``depth_study.png``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet
from tinygrad_caps.models.analysis.study_figures import layer_figures, plot_depth_study
from tinygrad_caps.models.app.studies import add_study_options, study_data, test_accuracy, train_images
from tinygrad_caps.models.capsnet import parse_hidden_capsules

FULL_BUDGET_IMAGES = 3000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=1.0, help="scale of the training images per configuration")
    p.add_argument("--depths", default="0,1,2,3,4", help="numbers of hidden capsule layers")
    p.add_argument("--hidden", default="32x12", help="COUNTxDIM of every hidden capsule layer")
    add_study_options(p)
    p.add_argument("--capsule-init", choices=("model", "peer"), default="model",
                   help="model: CapsNet's own initialization (weights N(0, 0.01), bias 0); peer: that of Peer et "
                        "al.'s code (capsule/capsule_layer.py: weights N(0, 0.2), bias 0.1) for every routing layer")
    p.add_argument("--out", default="runs/depth_study")
    return p.parse_args(argv)


def run_configuration(args, depth, bias, gradient, data):
    """Initial figures, one training pass, test accuracy and final figures of one configuration."""
    (train_x, train_y), (test_x, test_y), (stats_x, stats_y) = data
    tc.manual_seed(args.seed)
    hidden = parse_hidden_capsules(args.hidden) * depth
    model = CapsNet(routing_iterations=args.iterations, routing_gradient=gradient, hidden_capsules=hidden,
                    capsule_bias=bias, conv1_channels=args.conv1_channels, primary_types=args.primary_types)
    if args.capsule_init == "peer":
        for _, layer in model.routing_layers():
            tc.nn.init.normal_(layer.weight, 0.0, 0.2)
            if layer.bias is not None:
                tc.nn.init.constant_(layer.bias, 0.1)
    started = time.perf_counter()
    before = layer_figures(model, stats_x, stats_y)
    train_loss = train_images(model, train_x, train_y, args.batch_size, args.lr, args.seed)
    accuracy = test_accuracy(model, test_x, test_y)
    after = layer_figures(model, stats_x, stats_y)
    return {"depth": depth, "capsule_bias": bias, "routing_gradient": gradient, "train_loss": train_loss,
            "test_accuracy": accuracy, "initial": before, "trained": after,
            "seconds": time.perf_counter() - started}


def main(argv=None):
    args = parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    data = study_data(args, max(1, int(round(FULL_BUDGET_IMAGES * args.budget))))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for depth in depths:
        for bias in (False, True):
            for gradient in ("full", "detach"):
                row = run_configuration(args, depth, bias, gradient, data)
                results.append(row)
                grads = " ".join(f"{f['name']}={f['grad_norm']:.2e}" for f in row["initial"])
                print(f"depth {depth} bias {bias!s:5} {gradient:6} acc {row['test_accuracy']:.3f} "
                      f"loss {row['train_loss']:.4f} | init grad {grads} | {row['seconds']:.0f}s", flush=True)
    report = {"budget": args.budget, "train_images": len(data[0][1]), "test_images": len(data[1][1]),
              "options": vars(args), "results": results}
    (out / "depth_study.json").write_text(json.dumps(report, indent=1))
    drew = plot_depth_study(results, out / "depth_study.png")
    print(f"wrote {out / 'depth_study.json'}" + (f" and {out / 'depth_study.png'}" if drew else " (no matplotlib: no plot)"))
    return report


if __name__ == "__main__":
    main()
