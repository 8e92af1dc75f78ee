"""Figures of the gradient-flow lab: a gradflow report (``gradflow.png``) and a training run's
curves (``tinygrad-caps plot``). Needs matplotlib (the ``viz`` extra)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import UsageError


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _positive(values):
    """Values for a log axis: None and non-positive entries become NaN (not drawn)."""
    return [v if v is not None and v > 0 else np.nan for v in values]


def plot_gradflow(report: dict, path) -> None:
    """Four panels from a ``gradient_flow_report``: |grad u_hat| per iteration and path, coupling
    entropy per iteration, parameter gradient norms, and the cosine between the modes' gradients."""
    plt = pyplot()
    if plt is None:
        raise UsageError("gradflow.png needs matplotlib: pip install 'tinygrad-caps[viz]'")
    modes = list(report["modes"])
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    ax = axes[0, 0]
    for mode in modes:
        for layer in report["modes"][mode]["layers"]:
            rows = layer["iterations"]
            r = [row["iteration"] for row in rows]
            ax.plot(r, _positive([row["grad_norm_sum"] for row in rows]), "o-", label=f"{mode} {layer['name']} sum path")
            ax.plot(r, _positive([row["grad_norm_agreement"] for row in rows]), "s--",
                    label=f"{mode} {layer['name']} agreement path")
    ax.set(yscale="log", xlabel="routing iteration r", ylabel="|grad u_hat| through r",
           title="gradient reaching u_hat per iteration and path")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    for mode in modes:
        for layer in report["modes"][mode]["layers"]:
            rows = layer["iterations"]
            ax.plot([row["iteration"] for row in rows], [row["coupling_entropy"] for row in rows], "o-",
                    label=f"{mode} {layer['name']}")
    ax.set(xlabel="routing iteration r", ylabel="coupling entropy / log J", ylim=(0, 1.05),
           title="coupling entropy (1 uniform, 0 one-hot)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    ax = axes[1, 0]
    names = list(report["modes"][modes[0]]["parameter_grad_norms"])
    width = 0.8 / len(modes)
    for k, mode in enumerate(modes):
        norms = report["modes"][mode]["parameter_grad_norms"]
        ax.bar(np.arange(len(names)) + k * width, _positive([norms[n] for n in names]), width, label=mode)
    ax.set(yscale="log", ylabel="|grad|", title="parameter gradient norms")
    ax.set_xticks(np.arange(len(names)) + width * (len(modes) - 1) / 2, names, rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    cosines = report.get("mode_cosine") or {}
    if cosines:
        ax.bar(np.arange(len(cosines)), [np.nan if v is None else v for v in cosines.values()])
        ax.set_xticks(np.arange(len(cosines)), list(cosines), rotation=60, ha="right", fontsize=7)
        ax.set(ylim=(-1.05, 1.05), title=f"cosine between the {' and '.join(modes[:2])} gradients")
    else:
        ax.set_title("mode cosine: needs two modes")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _read_jsonl(path: Path) -> list:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}: line {number} is not JSON ({exc.msg})") from None
    return rows


def plot_run(run_dir, out=None) -> Path:
    """Loss and accuracy per epoch from ``RUN/metrics.jsonl`` and, when ``RUN/gradflow.jsonl`` exists,
    |grad u_hat| per iteration and path and the coupling entropy per iteration over the training steps.

    Returns the PNG's path (``out``, default ``RUN/plot.png``).
    """
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a run folder")
    if not metrics_path.exists():
        raise UsageError(f"{run_dir} holds no metrics.jsonl; is it a training run folder?")
    metrics = _read_jsonl(metrics_path)
    gradflow_path = run_dir / "gradflow.jsonl"
    gradflow = _read_jsonl(gradflow_path) if gradflow_path.exists() else []
    plt = pyplot()
    if plt is None:
        raise UsageError("plot needs matplotlib: pip install 'tinygrad-caps[viz]'")
    out = Path(out) if out else run_dir / "plot.png"
    panels = 4 if gradflow else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.8))
    epochs = [m["epoch"] for m in metrics]
    for key in ("train_loss", "test_loss"):
        axes[0].plot(epochs, [m.get(key) for m in metrics], "o-", label=key)
    axes[0].set(xlabel="epoch", ylabel="loss", title="loss")
    for key in ("train_accuracy", "test_accuracy"):
        axes[1].plot(epochs, [m.get(key) for m in metrics], "o-", label=key)
    axes[1].set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for ax in axes[:2]:
        ax.legend(fontsize=7)
    if gradflow:
        _plot_gradflow_lines(axes[2], axes[3], gradflow)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def _plot_gradflow_lines(norm_axis, entropy_axis, lines):
    steps = [line["step"] for line in lines]
    first = lines[0]["layers"]
    for k, layer in enumerate(first):
        for r in range(len(layer["iterations"])):
            def series(key):
                return [line["layers"][k]["iterations"][r][key] for line in lines]

            norm_axis.plot(steps, _positive(series("grad_norm_sum")), label=f"{layer['name']} r={r} sum")
            if r < len(layer["iterations"]) - 1:
                norm_axis.plot(steps, _positive(series("grad_norm_agreement")), "--", label=f"{layer['name']} r={r} agreement")
            entropy_axis.plot(steps, series("coupling_entropy"), label=f"{layer['name']} r={r}")
    norm_axis.set(yscale="log", xlabel="step", ylabel="|grad u_hat|", title="gradient per iteration and path")
    entropy_axis.set(xlabel="step", ylabel="coupling entropy / log J", title="coupling entropy")
    norm_axis.legend(fontsize=6)
    entropy_axis.legend(fontsize=6)
