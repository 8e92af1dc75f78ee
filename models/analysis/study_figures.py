"""The picture of a study's summary (``study run``'s summary.png): each configuration's mean test
accuracy with its interval and seeds, the learning curves, and every gradient-flow figure the study
reports over training, two panels a row, each drawn as its entry of ``figures.FIGURES`` says
(label, axis, range, log scale, texts).

Each curve panel has its own legend under it, where a configuration whose curve coincides with an
earlier one's (equal where shown, ``figure_style.coinciding_labels``) is marked "(= EARLIER)" when
the whole curves coincide (two or more points) and the two configurations have the same routing;
where only the values agree (one point, or two different routings) it says "(same values as
EARLIER)", with ", another routing" for different routings. The later curve is drawn over the
earlier, wider one. A configuration a panel does not draw is named in the panel with the reason
(a note where no curve runs under it: at the top or the bottom of the panel, else under its x
axis), and a panel with nothing to draw says why.

Every bounded statistic keeps to its range: T and the inner iterations' share are drawn on [0, 1],
1 - cos up to 2 (T and 1 - cos on a log axis, from their floor); a D-score (the standard deviation
of lengths or activations in [0, 1]) from 0 to where its values reach, never above 1/2; accuracy
axes never leave [0, 1]. On a log axis, values of 0 (and 1 - cos below 1e-12, rounding) are drawn
on a dotted floor a decade below the smallest positive value, and the legend says where: "< 1e-12:
identical, to rounding (drawn on this floor), at 1e-5".

Both accuracy panels (the means and the learning curves) draw the chance level, 1 / the number of
classes (``summary["classes"]``), as a dotted line labelled "chance (1/10)". An accuracy lies in
[0, 1], so a mean's interval is drawn clipped to [0, 1] (a Student-t interval of 2 or 3 seeds can
reach beyond it); where it is clipped, a triangle marks the clipped end and the legend says
"interval clipped to [0, 1]".
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
import textwrap

import numpy as np

from .figure_style import bounded_axis, coinciding_labels, integer_ticks, say_all_zero, series_style
from .figures import FIGURES
from .plots import _log_panel, pyplot

COLUMNS = 2
ACCURACY_RANGE = (0.0, 1.0)  # where an accuracy, and so the drawn part of its interval, lies
CLIPPED_LABEL = "interval clipped to [0, 1]"
CHANCE_STYLE = dict(color="0.35", linestyle=":", linewidth=1.5)
LEGEND_COLUMN_CHARACTERS = 26  # legend labels up to this long go two to a row under a panel
LEGEND_PAD = 3.6  # legend font sizes between a panel's bottom and its legend: room for the ticks and x label
NOTE_STYLE = dict(fontsize=9, color="0.25", bbox=dict(boxstyle="round", facecolor="white", edgecolor="0.7"))
FONTS = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10,
         "xtick.labelsize": 10, "ytick.labelsize": 10}


DIGEST_KEY = "tinygrad-caps summary digest"  # the PNG text field that holds summary_picture_digest
# the code that draws a summary: a change to any of them draws the picture again
_DRAWING_CODE = ("study_figures.py", "figures.py", "figure_style.py", "plots.py")


def plot_study_summary(summary: dict, path, digest: str | None = None) -> bool:
    """A study summary's picture (``path`` a file name or a binary file object, PNG): the mean test
    accuracy of every configuration with its 95% interval and its seeds' values, the mean learning
    curves, and the gradient-flow figures over training where the study logs them. ``digest``
    (``summary_picture_digest``) is kept in the PNG's text field DIGEST_KEY. False (nothing drawn)
    without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig = study_summary_figure(summary)
    metadata = {"Software": None, **({DIGEST_KEY: digest} if digest else {})}
    fig.savefig(path, format="png", dpi=100, metadata=metadata)
    plt.close(fig)
    return True


def summary_picture_digest(summary: dict) -> str | None:
    """A digest of everything ``plot_study_summary`` draws ``summary`` from: the summary, the
    drawing code's text and matplotlib's version (without importing it); None where that is not
    all (a figure registered at run time, whose drawing is not in our files) or matplotlib is
    missing. A picture that holds the digest of the summary at hand is that summary's picture."""
    from importlib import metadata
    from pathlib import Path

    from .figures import is_builtin_figure

    if not all(is_builtin_figure(name) for name in summary.get("figures", ())):
        return None
    try:
        version = metadata.version("matplotlib")
    except metadata.PackageNotFoundError:
        return None
    digest = hashlib.sha256(json.dumps(summary, sort_keys=True, default=repr).encode())
    digest.update(version.encode())
    here = Path(__file__).resolve().parent
    for name in _DRAWING_CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def png_text(data: bytes) -> dict:
    """The text fields (tEXt chunks) of PNG ``data`` as {keyword: text}; {} for data that is not a
    whole PNG (a damaged picture holds no digest, so it is drawn again)."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return {}
    fields, at = {}, 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if len(body) < length or len(data) < at + 12 + length:
            return {}
        if kind == b"tEXt" and b"\0" in body:
            keyword, text = body.split(b"\0", 1)
            fields[keyword.decode("latin-1")] = text.decode("latin-1")
        if kind == b"IEND":
            return fields
        at += 12 + length
    return {}


def study_summary_figure(summary: dict):
    """The matplotlib figure of ``plot_study_summary`` (for saving or inspecting): panels two a row,
    the accuracies, the learning curves, then one panel per figure of ``summary["figures"]``."""
    plt = pyplot()
    with plt.rc_context(FONTS):  # the texts take their sizes when made
        return _summary_figure(plt, summary)


def _summary_figure(plt, summary: dict):
    """``study_summary_figure``'s work, inside its font sizes: the grid, sized from the number of
    configurations (the accuracy panel's rows, the legends under the panels), and its panels."""
    rows = summary["rows"]
    figures = [name for name in summary.get("figures", ()) if name in FIGURES]
    panels = 2 + len(figures)
    grid_rows = math.ceil(panels / COLUMNS)
    longest = max((len(row["config_id"]) for row in rows), default=0)
    columns = 2 if 2 * longest + 5 <= LEGEND_COLUMN_CHARACTERS else 1  # as _finish will choose, about
    legend_h = 0.22 * math.ceil((len(rows) + 1) / columns) + 0.3
    fig, axes = plt.subplots(grid_rows, COLUMNS, squeeze=False, layout="constrained",
                             figsize=(6.4 * COLUMNS, grid_rows * (max(3.6, 0.28 * len(rows) + 1.2) + legend_h) + 0.5))
    axes = list(axes.ravel())
    for spare in axes[panels:]:
        fig.delaxes(spare)
    _accuracy_panel(axes[0], summary)
    _learning_panel(axes[1], summary)
    for ax, name in zip(axes[2:], figures):
        _figure_panel(ax, summary, name)
    finished = f"{summary.get('runs_finished', '?')} of {_count(summary.get('runs_planned', '?'), 'run')} finished"
    fig.suptitle(f"study {summary['study']}: {summary['metric']} after {_count(summary.get('epochs', '?'), 'epoch')}, "
                 f"{finished}"
                 + ("" if summary.get("complete", True) else " (the others are not drawn)"), fontsize=13)
    return fig


def _count(n, word: str) -> str:
    """"1 epoch", "3 epochs": ``n`` and ``word``, plural unless ``n`` is 1."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _nothing_yet(summary: dict) -> str:
    """The text of a panel with nothing to draw because no run has finished."""
    return (f"no finished run yet ({summary.get('runs_finished', 0)} of {summary.get('runs_planned', '?')}):\n"
            "nothing to draw")


def _accuracy_panel(ax, summary: dict) -> None:
    """Each configuration's mean with its 95% interval (clipped to [0, 1], a triangle at a clipped
    end) and its seeds' values, one row each, and the chance level; a configuration without a
    finished run says so on its row. The legend under the panel names the chance line and, only
    where an interval was clipped, the clipping."""
    rows = summary["rows"]
    finished = [row for row in rows if row["mean"] is not None]
    clipped_any = False
    for k, row in enumerate(rows):
        if row["mean"] is None:
            continue
        low, high = row["ci95"] if row["ci95"] is not None else (row["mean"], row["mean"])
        (low, high), ends = clipped_interval(low, high)
        ax.errorbar([row["mean"]], [k], xerr=[[max(0.0, row["mean"] - low)], [max(0.0, high - row["mean"])]],
                    fmt="o", color="C0", capsize=3)
        for end in ends:
            ax.plot([end], [k], "<" if end == ACCURACY_RANGE[0] else ">", color="C3", markersize=8, linestyle="none",
                    label="_nolegend_" if clipped_any else CLIPPED_LABEL)
            clipped_any = True
        ax.plot(row["values"], [k] * len(row["values"]), "x", color="0.4", markersize=6)
    ax.set(yticks=range(len(rows)), yticklabels=[row["config_id"] for row in rows], xlabel=summary["metric"],
           title="mean, 95% interval (t), seeds (x)")
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first configuration on top
    if not finished:
        ax.set_xlim(0, 1)
        say_all_zero(ax, _nothing_yet(summary))
        return
    _chance_line(ax, summary, vertical=True)
    bounded_axis(ax, *ACCURACY_RANGE, [v for row in finished for v in row["values"]], axis="x", span="data")
    for k, row in enumerate(rows):
        if row["mean"] is None:
            ax.text(0.02, k, "no finished run", transform=ax.get_yaxis_transform(), va="center", fontsize=10,
                    color="0.3", style="italic")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=3.6, ncol=2, frameon=False)


def clipped_interval(low: float, high: float):
    """An accuracy's interval clipped to [0, 1]: ((low, high) clipped, the clipped ends: the bounds,
    0.0 and/or 1.0, where the interval reached beyond them; empty where nothing was clipped)."""
    bottom, top = ACCURACY_RANGE
    ends = ([bottom] if low < bottom else []) + ([top] if high > top else [])
    return (min(max(low, bottom), top), max(min(high, top), bottom)), ends


def chance_level(summary: dict):
    """(1 / classes, "chance (1/classes)") of a summary with a number of classes, else None."""
    classes = summary.get("classes")
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
        return None
    return 1.0 / classes, f"chance (1/{classes})"


def _chance_line(ax, summary: dict, vertical: bool) -> None:
    """The chance level as a dotted line across an accuracy panel (vertical where the accuracy is
    the x axis), labelled for the legend; nothing where the summary has no number of classes."""
    chance = chance_level(summary)
    if chance is None:
        return
    level, label = chance
    (ax.axvline if vertical else ax.axhline)(level, label=label, zorder=1, **CHANCE_STYLE)


def _learning_panel(ax, summary: dict) -> None:
    """The mean learning curve of every configuration with a finished run."""
    metric, series, missing, kinds = summary["metric"], [], [], []
    for k, row in enumerate(summary["rows"]):
        learning = row["curves"]["learning"]
        if learning and learning.get("epoch"):
            series.append((learning["epoch"], learning[metric], row["config_id"], _style(k, summary, len(learning["epoch"]))))
            kinds.append(routing_of(row))
        else:
            missing.append((row["config_id"], "no finished run"))
    for (x, values, _, style), label in zip(series, coinciding_labels(series, kinds=kinds)):
        ax.plot(x, [math.nan if v is None else v for v in values], label=label, **style)
    if series:
        _chance_line(ax, summary, vertical=False)
        bounded_axis(ax, *ACCURACY_RANGE, [v for _, values, _, _ in series for v in values], span="data")
    ax.set(xlabel="epoch", ylabel=f"{metric} (mean over seeds)", title="learning curves")
    integer_ticks(ax.xaxis)
    _finish(ax, summary, series, missing, ACCURACY_RANGE)


def routing_of(row: dict):
    """The routing a summary row's configuration names (its "routing" option), None where it names
    none (the study's, or the model's default): two rows with different routings are different
    models however equal their values."""
    return (row.get("config") or {}).get("routing")


def _figure_panel(ax, summary: dict, name: str) -> None:
    """One gradient-flow figure of every configuration over the logged steps (mean over seeds),
    drawn as its entry of ``figures.FIGURES`` says: its values as shown, range, axis and texts."""
    figure = FIGURES[name]
    series, missing, kinds = [], [], []
    for k, row in enumerate(summary["rows"]):
        gradflow = row["curves"]["gradflow"]
        values = (gradflow or {}).get(name) or []
        if not row.get("n"):
            missing.append((row["config_id"], "no finished run"))
        elif not gradflow or not gradflow.get("step"):
            missing.append((row["config_id"], "no gradient-flow log"))
        elif all(v is None for v in values):
            missing.append((row["config_id"], figure.missing_reason or "not logged"))
        else:
            series.append((gradflow["step"], figure.drawn(values), row["config_id"],
                           _style(k, summary, len(gradflow["step"]))))
            kinds.append(routing_of(row))
    bounds = figure.axis_range
    if figure.log_scale and series:
        _log_panel(ax, series, figure.zero_text or "all values are 0", figure.floor_label or "0 (drawn on this floor)",
                   bounds=bounds, kinds=kinds)
    else:
        for (x, values, _, style), label in zip(series, coinciding_labels(series, kinds=kinds)):
            ax.plot(x, [math.nan if v is None else v for v in values], label=label, **style)
        if series and bounds is not None:
            bounded_axis(ax, *bounds, [v for _, values, _, _ in series for v in values], span=figure.axis_span)
    scale = " (log scale)" if ax.get_yscale() == "log" else ""
    ax.set(xlabel="training step", ylabel=(figure.axis_label or figure.label) + scale,
           title=f"{figure.shown_label or figure.label}\n(mean over seeds, logged steps)")
    integer_ticks(ax.xaxis)
    _finish(ax, summary, series, missing, bounds)


def _style(k: int, summary: dict, points: int) -> dict:
    """The k-th configuration's colour, marker and width (the same in every panel)."""
    return dict(series_style(k, len(summary["rows"]), points), color=f"C{k % 10}")


def _finish(ax, summary: dict, series: list, missing: list, bounds=None) -> None:
    """A curve panel's legend under it, and a note of what it does not draw and why: at the top of
    the panel, the axis raised to make room; on the axis of a statistic with ``bounds`` (low, high),
    which is never raised beyond ``high``, at the top or the bottom where no curve runs under it,
    else under the x axis, above the legend."""
    if not series:
        ax.set(yticks=[], xticks=[])
        nothing_finished = not any(row.get("n") for row in summary["rows"])
        say_all_zero(ax, _nothing_yet(summary) if nothing_finished else "nothing to draw:\n" + _missing_text(missing))
        return
    labels = ax.get_legend_handles_labels()[1]
    columns = 2 if max(map(len, labels)) <= LEGEND_COLUMN_CHARACTERS else 1  # never wider than its panel
    pad = LEGEND_PAD
    if missing:
        text = "not drawn:\n" + _missing_text(missing)
        lines = text.count("\n") + 1
        share = _note_share(lines)
        where = "top" if bounds is None else _free_band(ax, share)
        if where == "top" and bounds is None:
            _headroom(ax, share)
        elif where == "under" and ax.get_ylim()[1] < bounds[1]:  # room above the curves, within the range
            top = ax.get_ylim()[1]
            _headroom(ax, share, autoscale=False)
            ax.set_ylim(top=min(ax.get_ylim()[1], bounds[1]))
            where = _free_band(ax, share)
            if where != "top":
                ax.set_ylim(top=top)
                where = _free_band(ax, share)
        if where == "under":  # below the tick labels and the x label, the legend moved down to make room
            font = _font_points("legend.fontsize")
            ax.annotate(text, xy=(0.0, 0.0), xycoords="axes fraction", xytext=(0.0, -LEGEND_PAD * font),
                        textcoords="offset points", ha="left", va="top", **NOTE_STYLE)
            pad += (lines * NOTE_STYLE["fontsize"] * 1.2 + 12.0) / font
        else:
            ax.text(0.02, 0.98 if where == "top" else 0.02, text, transform=ax.transAxes, ha="left",
                    va=where, **NOTE_STYLE)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=pad, ncol=columns, frameon=False)


def _font_points(name: str) -> float:
    """A font size of the figure's settings (FONTS, in effect while the figure is made), in points."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties

    return FontProperties(size=rcParams[name]).get_size_in_points()


def _note_share(text_lines: int) -> float:
    """The share of a panel's height that a note of ``text_lines`` lines takes, about."""
    return min(0.5, 0.07 * text_lines + 0.06)


NOTE_MARGIN = 0.04  # of a panel's height between a note and the nearest point: a marker's half height, about


def _free_band(ax, share: float) -> str:
    """Where a note ``share`` of the panel high can go without covering a drawn point or line:
    "top", "bottom" (every point below, or above, that band) or "under" (the x axis)."""
    heights = []
    to_axes = ax.transAxes.inverted()
    for line in ax.lines:
        points = np.asarray(line.get_xydata(), dtype=np.float64)
        points = points[np.isfinite(points).all(axis=1)]
        if len(points):
            heights.extend(to_axes.transform(line.get_transform().transform(points))[:, 1])
    if all(h <= 1.0 - share - NOTE_MARGIN + 1e-9 for h in heights):
        return "top"
    if all(h >= share + NOTE_MARGIN for h in heights):
        return "bottom"
    return "under"


def _missing_text(missing: list) -> str:
    """"name (reason)" per line; configurations with the same reason share a line."""
    by_reason = {}
    for name, reason in missing:
        by_reason.setdefault(reason, []).append(name)
    return "\n".join(textwrap.fill(f"{', '.join(names)} ({reason})", 60, break_long_words=False,
                                   break_on_hyphens=False) for reason, names in by_reason.items())


def _headroom(ax, share: float, autoscale: bool = True) -> None:
    """Raise the top of ``ax``'s y axis so that its curves stay below a note that takes ``share`` of
    the panel's height at its top (on a log axis, in decades); from matplotlib's view of the data,
    or with ``autoscale`` False from the axis as it is."""
    if autoscale:
        ax.autoscale_view()
    share = min(0.6, share + NOTE_MARGIN)
    low, high = ax.get_ylim()
    if ax.get_yscale() == "log":
        top = math.log10(low) + (math.log10(high) - math.log10(low)) / (1.0 - share)
        ax.set_ylim(low, 10.0 ** top)
    else:
        ax.set_ylim(low, low + (high - low) / (1.0 - share))
