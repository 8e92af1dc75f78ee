"""Figures of the gradient-flow lab: a gradflow report (``gradflow.png``) and a training run's
curves (``tinygrad-caps plot``), whose gradient-flow panels are those of the figures registry
(``figures.plot_panels``: the gradient per iteration and path, the T-score, then one per
registered figure with a panel of its own). Needs matplotlib (the ``viz`` extra).

On the log axes a zero (no gradient, or uniform coupling) is drawn on a dotted floor a decade below
the smallest positive value, the legend saying where ("0 (drawn on this floor), at 1e-5"), and a
panel whose values are all zero says so. The coupling entropy is drawn as 1 - entropy / log J (Peer
et al.'s T-score) on a log axis: near-uniform couplings differ from 1 only in the tenth decimal,
which a linear axis can show only as an offset such as ``1e-5+9.999e-1``. Bounded statistics keep
to their range: the T-score's axis ends at 1 (and is [0, 1] where every T is 0), the cosine's is
[-1, 1], an accuracy's never leaves [0, 1]; a gradient norm's all-zero panel is [0, 1], not [-1, 1].
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from ..errors import UsageError
from .figure_style import (bounded_axis, coinciding_labels, integer_ticks, log_floor, mark_floor, on_log_axis,
                           picture_format, say_all_zero, series_style, single_point_room, write_values)
from .figures import FIGURES, layer_values, line_value, plot_panels

UNIFORM_TEXT = "every coupling is uniform\n(1 - entropy <= 0, to rounding)"
UNIFORM_FLOOR = "<= 0: uniform, to rounding (drawn on this floor)"
PATH_LINES = {"sum": "-", "agreement": "--"}
PATHS = ("sum", "agreement")
COSINE_RANGE = (-1.0, 1.0)
ACCURACY_RANGE = (0.0, 1.0)


def path_style(style: dict, path: str) -> dict:
    """``style`` for the curve of one path of u_hat: the sum path solid with filled markers, the
    agreement path dashed with hollow markers half as large again, so the two stay apart even where a
    one-step routing leaves a single point per path, or the two paths carry the same norm."""
    style = dict(style, linestyle=PATH_LINES[path])
    if path == "agreement":
        size = style.get("markersize", 6.0) * 1.5
        style.update(markerfacecolor="none", markersize=size, markeredgewidth=1.6)
    return style


def logged_paths(values_of) -> list:
    """The paths a trace has, given ``values_of(path)`` (its gradient norms over iterations or steps):
    "sum" always, "agreement" where some value is logged (one-step routings have it at r = 0,
    dynamic and EM routing at r < R-1; None where the trace has no such path)."""
    return [path for path in PATHS if path == "sum" or any(v is not None for v in values_of(path))]


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


def _needs_pyplot(what: str):
    plt = pyplot()
    if plt is None:
        raise UsageError(f"{what} needs matplotlib: pip install 'tinygrad-caps[viz]'")
    return plt


def _log_panel(ax, series, zero_text: str, floor_label: str = "0 (drawn on this floor)", bounds=None,
               kinds=None) -> None:
    """Draw ``series`` [(x, values, label, style)] of a quantity >= 0 on ``ax``: a log axis with zeros
    (and negatives, rounding errors) on a marked floor, or, when no value is positive, a linear one
    from 0 with the values drawn at 0 and ``zero_text`` written above them. ``bounds``: the
    quantity's range (low, high), which the axis keeps to (``bounded_axis``); ``kinds``: as
    ``coinciding_labels`` takes them."""
    every = [v for _, values, _, _ in series for v in values]
    floor = log_floor(every)
    for (x, values, _, style), label in zip(series, coinciding_labels(series, kinds=kinds)):
        y = on_log_axis(values, floor) if floor is not None else [np.nan if v is None else 0.0 for v in values]
        ax.plot(x, y, label=label, **style)
    if floor is None:
        if any(v is not None for v in every):
            low, high = bounds or (0.0, 1.0)
            bounded_axis(ax, low, high)  # the values are all 0: drawn on the axis's bottom, not mid-panel
            say_all_zero(ax, zero_text, height=0.75)
        return
    ax.set_yscale("log")
    if any(v is not None and v <= 0 for v in every):
        mark_floor(ax, floor, floor_label)
    if bounds is not None:
        bounded_axis(ax, *bounds, values=[v for v in every if v is not None and v > 0])


def _t_range() -> tuple:
    """Where 1 - entropy / log J lies (the T-score's range): 0 for a uniform coupling, 1 for a one-hot one."""
    return FIGURES["t_score"].axis_range


def _t_score_label(ax) -> str:
    scale = "log scale; " if ax.get_yscale() == "log" else ""
    return f"1 - coupling entropy / log J\n({scale}0 = uniform)"


def gradflow_figure(report: dict):
    """The matplotlib figure of ``plot_gradflow`` (four panels), for saving or inspecting."""
    plt = _needs_pyplot("gradflow.png")
    modes = list(report["modes"])
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    layer_names = [layer["name"] for layer in report["modes"][modes[0]]["layers"]]
    series, entropy = [], []
    for m, mode in enumerate(modes):  # a colour per mode and layer, the path in the line style
        for k, layer in enumerate(report["modes"][mode]["layers"]):
            rows = layer["iterations"]
            r = [row["iteration"] for row in rows]
            style = dict(series_style(m, len(modes), len(r)), color=colours[(m * len(layer_names) + k) % len(colours)])
            for path in logged_paths(lambda p: [row[f"grad_norm_{p}"] for row in rows]):
                series.append((r, [row[f"grad_norm_{path}"] for row in rows], f"{mode} {layer['name']} {path} path",
                               path_style(style, path)))
            entropy.append((r, [1.0 - row["coupling_entropy"] for row in rows], f"{mode} {layer['name']}", style))
    ax = axes[0, 0]
    _log_panel(ax, series, "all gradients are zero")
    ax.set(xlabel="routing iteration r", ylabel="|grad u_hat| through r", title="gradient reaching u_hat per iteration and path")
    integer_ticks(ax.xaxis)
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    _log_panel(ax, entropy, UNIFORM_TEXT, UNIFORM_FLOOR, bounds=_t_range())
    ax.set(xlabel="routing iteration r", ylabel=_t_score_label(ax), title="coupling: departure from uniform (T-score)")
    integer_ticks(ax.xaxis)
    ax.legend(fontsize=7)
    _parameter_panel(axes[1, 0], report, modes, colours)
    _cosine_panel(axes[1, 1], report, modes)
    if len(layer_names) > 1:
        fig.suptitle(f"routing layers: {', '.join(layer_names)}", fontsize=9)
    fig.tight_layout()
    return fig


def _parameter_panel(ax, report, modes, colours):
    names = list(report["modes"][modes[0]]["parameter_grad_norms"])
    norms = {mode: [report["modes"][mode]["parameter_grad_norms"][n] for n in names] for mode in modes}
    floor = log_floor([v for values in norms.values() for v in values])
    width = 0.8 / len(modes)
    for k, mode in enumerate(modes):
        where = np.arange(len(names)) + k * width
        values = norms[mode]
        if floor is None:
            ax.plot(where, [np.nan if v is None else v for v in values], "x", color=colours[k], label=mode)
            continue
        ax.bar(where, _positive(values), width, color=colours[k], label=mode)
        zeros = [x for x, v in zip(where, values) if v is not None and v <= 0]
        if zeros:
            ax.plot(zeros, [floor] * len(zeros), "v", color=colours[k], markersize=7)
    if floor is None:
        say_all_zero(ax, "all parameter gradients are zero")
    else:
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor / 2)
        if any(v is not None and v <= 0 for values in norms.values() for v in values):
            mark_floor(ax, floor, "0 (triangle on this floor)")
    ax.set(ylabel="|grad|", title="parameter gradient norms")
    ax.set_xticks(np.arange(len(names)) + width * (len(modes) - 1) / 2, names, rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=7)


def _cosine_panel(ax, report, modes):
    cosines = report.get("mode_cosine") or {}
    if not cosines:
        ax.set_title("mode cosine: needs two modes")
        ax.axis("off")
        return
    values = list(cosines.values())
    ax.bar(np.arange(len(cosines)), [np.nan if v is None else v for v in values])
    undefined = [k for k, v in enumerate(values) if v is None]
    for k in undefined:
        ax.text(k, 0.03, "n/a", ha="center", va="bottom", fontsize=7, color="0.35")
    ax.axhline(0, color="0.3", linewidth=0.6)
    ax.set_xlim(-0.6, len(values) - 0.4)
    ax.set_xticks(np.arange(len(cosines)), list(cosines), rotation=60, ha="right", fontsize=7)
    title = f"cosine between the {' and '.join(modes[:2])} gradients"
    ax.set(ylim=COSINE_RANGE, title=title + ("\n(n/a: a gradient is zero)" if undefined else ""))


def plot_gradflow(report: dict, path) -> None:
    """Four panels from a ``gradient_flow_report``: |grad u_hat| per iteration and path, 1 - coupling
    entropy per iteration, parameter gradient norms, and the cosine between the modes' gradients.
    The format follows ``path``'s suffix (.png, .pdf or .svg)."""
    fig = gradflow_figure(report)
    _save(fig, path)


def _save(fig, path) -> None:
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format=picture_format(path) or "png")
    plt.close(fig)


def plot_metrics(metrics: list, gradflow: list, path, name: str = "") -> None:
    """``run_figure`` saved to ``path`` (the format follows its suffix): the curves of checked log lines."""
    _needs_pyplot("plot")
    _save(run_figure(metrics, gradflow, name), path)


def run_figure(metrics: list, gradflow: list, name: str = ""):
    """The matplotlib figure of ``tinygrad-caps plot`` from checked log lines (``app.run_logs.read_metrics``
    and ``read_gradflow``): loss and accuracy, and with gradflow lines a gradient-flow panel per
    panel of ``figures.plot_panels()`` (the gradient per iteration and path, the T-score, then one
    per figure registered with a panel of its own), two panels a row."""
    plt = _needs_pyplot("plot")
    if gradflow:
        panels = gradflow_panels()
        rows = math.ceil((2 + len(panels)) / 2)
        fig, grid = plt.subplots(rows, 2, figsize=(11, 4.25 * rows))
        axes = list(grid.ravel())
        for spare in axes[2 + len(panels):]:
            fig.delaxes(spare)
    else:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    epochs = [m["epoch"] for m in metrics]
    for ax, quantity, keys in ((axes[0], "loss", ("train_loss", "test_loss")),
                               (axes[1], "accuracy", ("train_accuracy", "test_accuracy"))):
        if not metrics:
            say_all_zero(ax, "no finished epoch yet")
            ax.set(title=quantity, xticks=[], yticks=[])
            continue
        for k, key in enumerate(keys):
            values = [m[key] for m in metrics]
            ax.plot(epochs, values, label=key, **series_style(k, len(keys), len(epochs)))
            if len(epochs) == 1:
                write_values(ax, epochs, values)
        ax.set(xlabel="epoch", ylabel=quantity, title=quantity)
        integer_ticks(ax.xaxis)
        single_point_room(ax, epochs)
        if quantity == "accuracy":  # the view of the data, never beyond [0, 1]
            bounded_axis(ax, *ACCURACY_RANGE, [m[key] for m in metrics for key in keys], span="data")
        ax.legend(fontsize=8)
    if gradflow:
        for ax, (panel, figures) in zip(axes[2:], panels.items()):
            RUN_PANELS.get(panel, _figures_panel)(ax, gradflow, figures)
            integer_ticks(ax.xaxis)
            single_point_room(ax, [line["step"] for line in gradflow])
            if panel in RUN_PANELS or ax.get_legend_handles_labels()[1]:
                ax.legend(fontsize=7)
    if name:  # a study run's name holds its configuration's options: wrapped, never cut
        fig.suptitle(textwrap.fill(f"run {name}", 120, break_long_words=False), fontsize=11)
    fig.tight_layout()
    return fig


def gradflow_panels() -> dict:
    """``figures.plot_panels()`` in the order ``run_figure`` draws them: its own panels first (the
    gradient per path, then the T-score), then the others in the registry's order."""
    panels = plot_panels()
    return {**{name: panels[name] for name in RUN_PANELS if name in panels},
            **{name: figures for name, figures in panels.items() if name not in RUN_PANELS}}


def _layer_series(lines, figure=None, key=None) -> list:
    """[(prefix, values over the lines)], one per layer and iteration, of an iteration or layer
    ``figure`` (or of the rows' ``key``; None where a row lacks it); the prefix "r=R", or
    "LAYER r=R" where there are several layers."""
    several = len(lines[0]["layers"]) > 1
    found = []
    for k, layer in enumerate(lines[0]["layers"]):
        rows = [line["layers"][k]["iterations"] for line in lines]
        per_line = [[row.get(key) for row in one] if key else layer_values(figure, one) for one in rows]
        for r in range(len(layer["iterations"])):
            found.append((f"{layer['name']} r={r}" if several else f"r={r}", [values[r] for values in per_line]))
    return found


def _path_panel(ax, lines, figures):
    """|grad u_hat| per layer, iteration and path (every path the trace has: "agreement" wherever
    some line logged it)."""
    steps = [line["step"] for line in lines]
    norms = []
    for (prefix, sums), (_, agreements) in zip(_layer_series(lines, key="grad_norm_sum"),
                                               _layer_series(lines, key="grad_norm_agreement")):
        values = {"sum": sums, "agreement": agreements}
        for path in logged_paths(values.get):
            norms.append((steps, values[path], f"{prefix} {path}", path))
    norms = [(x, values, label, path_style(series_style(k, len(norms), len(steps)), path))
             for k, (x, values, label, path) in enumerate(norms)]
    _log_panel(ax, norms, "all gradients are zero")
    ax.set(xlabel="step", ylabel="|grad u_hat|", title="gradient per iteration and path")


def _t_panel(ax, lines, figures):
    """1 - entropy per layer and iteration (every log holds the entropy; the T-score came later)."""
    steps = [line["step"] for line in lines]
    series = _layer_series(lines, key="coupling_entropy")
    entropies = [(steps, [None if e is None else 1.0 - e for e in values], prefix,
                  series_style(k, len(series), len(steps))) for k, (prefix, values) in enumerate(series)]
    _log_panel(ax, entropies, UNIFORM_TEXT, UNIFORM_FLOOR, bounds=_t_range())
    ax.set(xlabel="step", ylabel=_t_score_label(ax), title="coupling: departure from uniform (T-score)")


def _figures_panel(ax, lines, figures):
    """A panel of registered figures over the logged steps: per layer and iteration for a figure
    stored per iteration (or derived per layer), one curve for a line figure; drawn as each says
    (``shown``, its range, a log axis with its floor and zero texts)."""
    steps = [line["step"] for line in lines]
    series = []
    for figure in figures:
        if figure.per == "line":
            found = [(figure.name, [line_value(figure, line) for line in lines])]
        else:
            found = [(f"{figure.name} {prefix}" if len(figures) > 1 else prefix, values)
                     for prefix, values in _layer_series(lines, figure)]
        series += [(steps, figure.drawn(values), label) for label, values in found]
    series = [(x, values, label, series_style(k, len(series), len(steps))) for k, (x, values, label) in enumerate(series)]
    first = figures[0]
    every = [v for _, drawn, _, _ in series for v in drawn if v is not None]
    if not every:
        say_all_zero(ax, "not logged" if first.missing_reason is None else first.missing_reason)
    elif first.log_scale:
        _log_panel(ax, series, first.zero_text or "all values are 0", first.floor_label or "0 (drawn on this floor)",
                   bounds=first.axis_range)
    else:
        for (x, drawn, label, style), shown in zip(series, coinciding_labels(series)):
            ax.plot(x, [np.nan if v is None else v for v in drawn], label=shown, **style)
        if first.axis_range is not None:
            bounded_axis(ax, *first.axis_range, every, span=first.axis_span)
    scale = " (log scale)" if ax.get_yscale() == "log" else ""
    ax.set(xlabel="step", ylabel=(first.axis_label or first.label) + scale,
           title=", ".join(figure.shown_label or figure.label for figure in figures))


# the panels ``run_figure`` draws in a way of their own, by panel name (figures.plot_panels)
RUN_PANELS = {"paths": _path_panel, "t_score": _t_panel}
