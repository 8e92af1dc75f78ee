"""The picture of a study's summary (``study run``'s summary.png): each configuration's mean test
accuracy with its interval and seeds, the learning curves, and the gradient-flow figures over
training."""
from __future__ import annotations

from .figure_style import integer_ticks, series_style
from .plots import pyplot

FIGURE_LABELS = {"inner_share": "inner iterations' share of |grad u_hat| (DigitCaps)",
                 "mode_cosine": "cos(full, detach) of the gradient", "t_score": "T-score (mean over routing layers)",
                 "d_score": "D-score (hidden layers)", "digit_d_score": "D of DigitCaps",
                 "lowest_grad_norm": "|grad u_hat| of the lowest routing layer"}


LOG_FIGURES = ("mode_cosine", "t_score")  # drawn on a log axis (1 - cos for the cosine)
# 1 - cos below this is float64 rounding of identical gradients (1 iteration's "modes"), not a figure
COSINE_ROUNDING = 1e-12


def plot_study_summary(summary: dict, path) -> bool:
    """A study summary's picture (``path`` a file name or a binary file object, PNG): the mean test
    accuracy of every configuration with its 95% interval and its seeds' values, the mean learning
    curves, and the gradient-flow figures over training where the study logs them. False (nothing
    drawn) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    rows = summary["rows"]
    figures = [name for name in summary.get("figures", ()) if name in ("inner_share", "mode_cosine", "t_score")][:2]
    panels = 2 + len(figures)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.2 + 0.22 * len(rows)))
    bars, curves = axes[0], axes[1]
    for k, row in enumerate(rows):
        if row["mean"] is not None:
            low, high = row["ci95"] if row["ci95"] is not None else (row["mean"], row["mean"])
            bars.errorbar([row["mean"]], [k], xerr=[[row["mean"] - low], [high - row["mean"]]], fmt="o", color="C0",
                          capsize=3)
            bars.plot(row["values"], [k] * len(row["values"]), "x", color="0.4", markersize=5)
    bars.set(yticks=range(len(rows)), yticklabels=[row["config_id"] for row in rows], xlabel=summary["metric"],
             title=f"{summary['study']}: mean, 95% interval (t), seeds (x)")
    bars.invert_yaxis()
    for k, row in enumerate(rows):
        learning = row["curves"]["learning"]
        if learning:
            curves.plot(learning["epoch"], learning[summary["metric"]], label=row["config_id"], color=f"C{k % 10}",
                        **series_style(k, len(rows), len(learning["epoch"])))
    curves.set(xlabel="epoch", ylabel=f"{summary['metric']} (mean over seeds)", title="learning curves")
    integer_ticks(curves.xaxis)
    for ax, name in zip(axes[2:], figures):
        for k, row in enumerate(rows):
            gradflow = row["curves"]["gradflow"]
            if gradflow and any(v is not None for v in gradflow[name]):
                values = [None if v is None else (1.0 - v if name == "mode_cosine" else v) for v in gradflow[name]]
                if name in LOG_FIGURES:  # zeros (and rounding below them) are left out of a log axis
                    floor = COSINE_ROUNDING if name == "mode_cosine" else 0.0
                    values = [v if v is not None and v > floor else None for v in values]
                ax.plot(gradflow["step"], [float("nan") if v is None else v for v in values], label=row["config_id"],
                        color=f"C{k % 10}", **series_style(k, len(rows), len(gradflow["step"])))
        label = "1 - " + FIGURE_LABELS[name] if name == "mode_cosine" else FIGURE_LABELS[name]
        scale = {"mode_cosine": "log scale; < 1e-12 (rounding) not drawn", "t_score": "log scale; 0 not drawn"}
        ax.set(xlabel="training step", ylabel=scale.get(name, ""), title=f"{label}\n(mean over seeds, logged steps)")
        if name in LOG_FIGURES and ax.lines:
            ax.set_yscale("log")
    # one legend for every curve panel, below them: a legend inside a panel hid the curves under it
    drawn = {}
    for ax in axes[1:]:
        for line in ax.lines:
            drawn.setdefault(line.get_label(), line)
    if drawn:
        fig.legend(list(drawn.values()), list(drawn), loc="lower center", ncol=min(len(drawn), 8), fontsize=8,
                   frameon=False)
    fig.tight_layout(rect=(0, 0.1 if drawn else 0, 1, 1))
    fig.savefig(path, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return True
