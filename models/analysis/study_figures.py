"""Figures the capsule studies (benchmarks/studies/) record: per routing layer, the gradient norm
reaching its weight, the coupling entropy and the D-score of its last iteration (from
``gradient_flow_report``); the split of a gradient between the margin and reconstruction terms;
and the depth study's picture."""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F

from ..capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT, capsule_loss
from .gradflow import gradient_flow_report
from .plots import pyplot


def layer_figures(model, x, y) -> list:
    """Per routing layer (bottom to top): name, gradient norm of the batch loss at its weight, and
    the coupling entropy and D-score of its last routing iteration, on the batch (x, y), in the
    model's own routing-gradient mode, as ``gradient_flow_report`` measures them."""
    report = gradient_flow_report(model, x, y, modes=(model.config.routing_gradient,))
    measured = next(iter(report["modes"].values()))
    return [{"name": layer["name"], "grad_norm": measured["parameter_grad_norms"][f"{layer['name']}.weight"],
             "coupling_entropy": layer["iterations"][-1]["coupling_entropy"],
             "d_score": layer["iterations"][-1]["d_score"]}
            for layer in measured["layers"]]


def gradient_shares(model, x, y, parameter="digit.weight",
                    reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT) -> dict:
    """Norms of the gradient reaching ``parameter`` from the margin term and from the weighted
    reconstruction term of ``capsule_loss`` (in the model's conventions), and the margin term's share
    |g_m|^2 / (|g_m|^2 + |g_r|^2)."""
    target = dict(model.named_parameters())[parameter]
    outputs = model(x, y)
    _, margin, recon = capsule_loss(outputs.lengths, outputs.reconstruction, x, y, reconstruction_weight,
                                    convention=model.config.conventions, return_terms=True)
    (g_margin,) = tc.grad(F.mean(margin), [target], retain_graph=True)
    (g_recon,) = tc.grad(reconstruction_weight * F.mean(recon), [target])
    m = float(np.sqrt((g_margin.numpy().astype(np.float64) ** 2).sum()))
    r = float(np.sqrt((g_recon.numpy().astype(np.float64) ** 2).sum()))
    return {"margin_grad_norm": m, "reconstruction_grad_norm": r,
            "margin_share": m * m / (m * m + r * r) if m + r > 0 else float("nan")}


def plot_depth_study(results: list, path) -> bool:
    """The depth study's picture: test accuracy and the gradient reaching the lowest routing layer at
    initialization, against the number of hidden capsule layers; False (nothing drawn) without matplotlib."""
    plt = pyplot()
    if plt is None:
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
