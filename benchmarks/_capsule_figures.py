"""Figures the capsule studies record: per routing layer, the gradient norm reaching its weight, the
coupling entropy and the D-score of its last iteration (from ``gradient_flow_report``); the split of
a gradient between the margin and reconstruction terms; a small training loop and the test accuracy."""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps.data import BatchIterator
from tinygrad_caps.models import margin_loss, reconstruction_loss
from tinygrad_caps.models.gradflow import gradient_flow_report


def add_study_options(p) -> None:
    """The options both studies share: data, the reduced model's sizes, the training budget's knobs."""
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--stats-images", type=int, default=32, help="batch on which the gradient figures are measured")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--conv1-channels", type=int, default=64)
    p.add_argument("--primary-types", type=int, default=16)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)


def losses(model, x, y, convention="paper", reconstruction_weight=0.0005):
    """(margin term, weighted reconstruction term) of the batch loss, each a scalar Tensor."""
    _, lengths, reconstruction = model(x, y)
    margin = F.mean(margin_loss(lengths, y, convention=convention))
    recon = reconstruction_weight * F.mean(reconstruction_loss(reconstruction, x))
    return margin, recon


def layer_figures(model, x, y) -> list:
    """Per routing layer (bottom to top): name, gradient norm of the batch loss at its weight, and
    the coupling entropy and D-score of its last routing iteration, on the batch (x, y), in the
    model's own routing-gradient mode, as ``gradient_flow_report`` measures them."""
    report = gradient_flow_report(model, x, y, modes=(model.config["routing_gradient"],))
    measured = next(iter(report["modes"].values()))
    return [{"name": layer["name"], "grad_norm": measured["parameter_grad_norms"][f"{layer['name']}.weight"],
             "coupling_entropy": layer["iterations"][-1]["coupling_entropy"],
             "d_score": layer["iterations"][-1]["d_score"]}
            for layer in measured["layers"]]


def gradient_shares(model, x, y, parameter="digit.weight") -> dict:
    """Norms of the gradient reaching ``parameter`` from the margin term and from the weighted
    reconstruction term, and the margin term's share |g_m|^2 / (|g_m|^2 + |g_r|^2)."""
    target = dict(model.named_parameters())[parameter]
    margin, recon = losses(model, x, y, model.config.get("conventions", "paper"))
    (g_margin,) = tc.grad(margin, [target], retain_graph=True)
    (g_recon,) = tc.grad(recon, [target])
    m = float(np.sqrt((g_margin.numpy().astype(np.float64) ** 2).sum()))
    r = float(np.sqrt((g_recon.numpy().astype(np.float64) ** 2).sum()))
    return {"margin_grad_norm": m, "reconstruction_grad_norm": r,
            "margin_share": m * m / (m * m + r * r) if m + r > 0 else float("nan")}


def train_images(model, images, labels, batch_size, lr, seed, convention="paper"):
    """One pass of Adam over (images, labels) in shuffled batches; returns the mean training loss."""
    optimizer = tc.optim.Adam(model.parameters(), lr=lr)
    total, seen = 0.0, 0
    model.train()
    for x, y in BatchIterator(images, labels, batch_size, shuffle=True, seed=seed).batches():
        margin, recon = losses(model, tc.tensor(x), y, convention)
        loss = margin + recon
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        seen += len(y)
    return total / max(seen, 1)


def test_accuracy(model, images, labels, batch_size=100) -> float:
    """Share of test images whose longest capsule is the label."""
    model.eval()
    correct = 0
    with tc.no_grad():
        for x, y in BatchIterator(images, labels, batch_size).batches():
            _, lengths, _ = model(tc.tensor(x))
            correct += int((lengths.numpy().argmax(axis=1) == y).sum())
    return correct / max(len(labels), 1)
