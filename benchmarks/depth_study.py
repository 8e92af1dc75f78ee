"""Depth study: do deeper stacks of routing layers train, with and without a capsule bias?

For 0 to 4 hidden capsule layers of (32, 12) (Peer, Stabinger & Rodriguez-Sanchez 2019), with and
without ``capsule_bias``, with the ``full`` and ``detach`` routing gradient, trains the README's
reduced CapsNet for the same budget on Fashion-MNIST and records the test accuracy and, at
initialization and after training, per routing layer: the gradient norm reaching its weight, the
coupling entropy and the D-score of its last routing iteration.

    python benchmarks/depth_study.py --out /tmp/depth            # the default budget
    python benchmarks/depth_study.py --budget 0.1 --out /tmp/d   # a tenth of it

``--budget`` scales the number of training images of every configuration (default 1.0: 3,000
images, one pass; about 30 minutes for all 20 configurations on 2 idle CPU cores, extrapolated
from runs at budgets 0.1 and 0.2, not measured at full budget).
``--capsule-init peer`` replaces the routing layers' initialization by that of Peer et al.'s code
(weights N(0, 0.2), bias 0.1) to separate the effect of the bias from that of its initial value. Writes
``depth_study.json`` and, with matplotlib (the viz extra), ``depth_study.png``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tinygrad_caps as tc  # noqa: E402
from _capsule_figures import add_study_options, layer_figures, test_accuracy, train_images  # noqa: E402
from tinygrad_caps.data import load_dataset  # noqa: E402
from tinygrad_caps.models import CapsNet  # noqa: E402
from tinygrad_caps.models.capsnet import parse_hidden_capsules  # noqa: E402

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


def load(args):
    images, labels = load_dataset(args.dataset, "train", args.data_dir)
    test_images, test_labels = load_dataset(args.dataset, "test", args.data_dir)
    n_train = max(1, int(round(FULL_BUDGET_IMAGES * args.budget)))
    stats = (tc.tensor(images[-args.stats_images:].astype(np.float32) / 255.0), labels[-args.stats_images:])
    return (images[:n_train], labels[:n_train]), (test_images[:args.test_images], test_labels[:args.test_images]), stats


def plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for bias in (False, True):
        for gradient, style in (("full", "-"), ("detach", "--")):
            rows = sorted((r for r in results if r["capsule_bias"] == bias and r["routing_gradient"] == gradient),
                          key=lambda r: r["depth"])
            label = f"{'bias' if bias else 'no bias'}, {gradient}"
            left.plot([r["depth"] for r in rows], [r["test_accuracy"] for r in rows], style, marker="o", label=label)
            right.semilogy([r["depth"] for r in rows], [r["initial"][0]["grad_norm"] for r in rows], style,
                           marker="o", label=label)
    depths = sorted({r["depth"] for r in results})
    left.set(xlabel="hidden capsule layers", ylabel="test accuracy", title="accuracy after the budget", xticks=depths)
    right.set(xlabel="hidden capsule layers", ylabel="|dL/dW| of the lowest routing layer", xticks=depths,
              title="gradient reaching the lowest routing layer (init;\nexact zeros are not drawn)")
    left.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv=None):
    args = parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    data = load(args)
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
    drew = plot(results, out / "depth_study.png")
    print(f"wrote {out / 'depth_study.json'}" + (f" and {out / 'depth_study.png'}" if drew else " (no matplotlib: no plot)"))
    return report


if __name__ == "__main__":
    main()
