"""The statistics of the gradient flow, each one entry of one registry (``FIGURES``): how it is
computed, what it is called, and how it is tabulated, drawn, reported by a study and tagged for
TensorBoard. The ``gradflow`` table's columns (``table_columns``), ``plot``'s gradient-flow panels
(``plot_panels``), the figures a study may report (``study_figure_names``, ``line_values``) and the
TensorBoard scalars of a gradflow line (``tensorboard_scalars``) all come from it, so a new
statistic is one ``Figure`` entry (``register_figure``) and its test.

What ``compute`` reads depends on ``per``:

    "iteration"  an IterationView: one routing iteration of one layer's trace (``routing_statistics``);
                 the value is stored in every iteration row of the gradient-flow report and of
                 gradflow.jsonl, under the figure's name, in this registry's order
    "layer"      one layer's iteration rows (a report's or a gradflow line's): a value per iteration,
                 derived from the stored ones (the table's path shares)
    "line"       a gradflow.jsonl line (or one mode of a report): one value

A study reads one value per logged line (``line_value``): a line figure's own, an ``of_line`` where
the figure has one, else the mean over the routing layers of the last iteration's value.

The built-in entries reproduce what each consumer showed before they came from here: an entry
drawn, tabulated or tagged nowhere says so (``column``, ``panel`` or ``tag`` None, ``study`` False),
while a new entry gets a table column, a panel of its own in ``plot``, a place among a study's
figures and the TensorBoard tag ``figure/<name>`` unless it says otherwise.
"""
from __future__ import annotations

import math
import re
import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .routing_statistics import inner_share, network_scores, path_norms, path_shares, polarization

KINDS = ("iteration", "layer", "line")
SPANS = ("range", "from low")  # how much of its range a linear panel shows (``figure_style.bounded_axis``)
# 1 - cos below this is float64 rounding of identical gradients (1 iteration's "modes"), not a figure
COSINE_ROUNDING = 1e-12
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


# ----- the texts of the gradflow table's cells -----

def fixed_text(value, digits: int = 4) -> str:
    """A statistic in [-1, 1] with fixed decimals ("-" for None; no "-0.0000" from rounding noise)."""
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def share_text(value) -> str:
    """A share in [0, 1]: three decimals, or two significant digits below 0.001 ("-" for None)."""
    if value is None:
        return "-"
    return f"{value:.1e}" if 0 < value < 1e-3 else f"{value:.3f}"


def norm_text(value) -> str:
    """A gradient norm (or any non-negative statistic) in scientific notation ("-" for None)."""
    return "-" if value is None else f"{value:.3e}"


@dataclass(frozen=True)
class Column:
    """A gradflow table column: header, width, a value's text ('-' for None)."""

    header: str
    width: int
    format: Callable = norm_text   # value -> its text (None included)

    def text(self, value) -> str:
        """``value``'s text right-aligned in the column's width."""
        return f"{self.format(value):>{self.width}}"


class _Default:
    """The default of a Figure's column, panel and tag: derived from its name (see ``Figure``)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()


@dataclass(frozen=True)
class Figure:
    """One statistic: how it is computed, labelled, drawn, tabulated and tagged.

    ``compute`` reads what ``per`` says (the module docstring); ``label`` names it (a panel's title,
    a study panel's), ``axis_label`` its axis (default: the label); ``axis_range`` (low, high) is
    where its drawn values lie, which an axis keeps to, and ``axis_span`` how much of it a linear
    panel shows ("range" or "from low"); ``log_scale`` draws it on a log axis, zeros on a floor
    (``floor_label`` says so), a panel of zeros saying ``zero_text``. ``shown`` maps a value to the
    one drawn (``shown_label`` its name: 1 - cos for the mode cosine). ``of_line`` gives an iteration
    or layer figure's value for a whole line; ``missing_reason`` says why a study configuration has
    none. ``column`` (a Column), ``panel`` (``plot``'s panel name: figures of one name share it),
    ``tag`` (its TensorBoard tag) and ``study`` (whether a study may report it) default to a column
    headed by the name, a panel of its own, ``figure/<name>`` and True; None (False) for none.
    """

    name: str
    compute: Callable
    label: str
    axis_range: tuple | None = None
    log_scale: bool = False
    per: str = "iteration"
    of_line: Callable | None = None
    axis_label: str | None = None
    axis_span: str = "range"
    column: Column | None = DEFAULT
    panel: str | None = DEFAULT
    tag: str | None = DEFAULT
    study: bool = True
    missing_reason: str | None = None
    zero_text: str | None = None
    floor_label: str | None = None
    shown: Callable | None = None
    shown_label: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"Figure: name {self.name!r} must be lower-case letters, digits and '_' (at most 64), "
                             "starting with a letter")
        if self.per not in KINDS:
            raise ValueError(f"Figure {self.name}: per must be one of {', '.join(KINDS)}, got {self.per!r}")
        for what in ("compute", "of_line", "shown"):
            value = getattr(self, what)
            if not callable(value) and (what == "compute" or value is not None):
                raise ValueError(f"Figure {self.name}: {what} must be callable, got {value!r}")
        if self.axis_range is not None:
            try:
                low, high = (float(end) for end in self.axis_range)
            except (TypeError, ValueError):
                low = high = math.nan
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError(f"Figure {self.name}: axis_range must be (low, high) with low < high, "
                                 f"got {self.axis_range!r}")
        if self.axis_span not in SPANS:
            raise ValueError(f"Figure {self.name}: axis_span must be one of {', '.join(SPANS)}, got {self.axis_span!r}")
        defaults = {"column": Column(self.name, max(10, len(self.name))), "panel": self.name,
                    "tag": f"figure/{self.name}"}
        for what, default in defaults.items():
            if getattr(self, what) is DEFAULT:
                object.__setattr__(self, what, default)
        if self.column is not None and not isinstance(self.column, Column):
            raise ValueError(f"Figure {self.name}: column must be a Column or None, got {self.column!r}")

    def drawn(self, values) -> list:
        """``values`` as a panel draws them (``shown`` of each; None stays None)."""
        if self.shown is None:
            return list(values)
        return [None if value is None else self.shown(value) for value in values]


FIGURES: dict = {}
_BUILTIN: set = set()  # the names of the figures below: never replaced or forgotten


def is_builtin_figure(name: str) -> bool:
    """Whether ``name`` is one of the figures defined here (not one registered at run time)."""
    return name in _BUILTIN


def register_figure(figure: Figure, *, replace: bool = False) -> Figure:
    """Add a statistic to ``FIGURES`` (last in their order); ValueError for a name taken, unless
    ``replace`` (a built-in figure is never replaced). Returns ``figure``."""
    if not isinstance(figure, Figure):
        raise TypeError(f"register_figure: expected a Figure, got {type(figure).__name__}")
    builtin = figure.name in _BUILTIN
    if figure.name in FIGURES and (builtin or not replace):
        raise ValueError(f"register_figure: a figure named {figure.name!r} is registered already"
                         + ("" if builtin else " (replace=True to replace it)"))
    FIGURES[figure.name] = figure
    return figure


def unregister_figure(name: str) -> None:
    """Forget a figure registered with ``register_figure`` (the built-in ones stay)."""
    if name in _BUILTIN:
        raise ValueError(f"unregister_figure: {name!r} is built in")
    FIGURES.pop(name, None)


def iteration_figures() -> list:
    """The figures stored per routing iteration (``routing_statistics``' keys), in order."""
    return [figure for figure in FIGURES.values() if figure.per == "iteration"]


def table_columns() -> list:
    """The gradflow table's columns (figures per iteration or layer with a column), in order."""
    return [figure for figure in FIGURES.values() if figure.column is not None and figure.per != "line"]


def line_columns() -> list:
    """The line figures with a column: the gradflow table writes each on a line of its own per mode."""
    return [figure for figure in FIGURES.values() if figure.column is not None and figure.per == "line"]


def plot_panels() -> dict:
    """``plot``'s gradient-flow panels: {panel name: [figures drawn in it]}, in order of appearance."""
    panels = {}
    for figure in FIGURES.values():
        if figure.panel is not None:
            panels.setdefault(figure.panel, []).append(figure)
    return panels


def study_figure_names() -> tuple:
    """The names ``register_study(figures=...)`` accepts, in order."""
    return tuple(figure.name for figure in FIGURES.values() if figure.study)


def tagged_figures() -> list:
    """The figures with a TensorBoard tag of their own."""
    return [figure for figure in FIGURES.values() if figure.tag is not None]


def layer_values(figure: Figure, rows: list) -> list:
    """An iteration or layer figure's value at each of one layer's iteration ``rows`` (None where
    a row does not hold it: a log written before the figure existed)."""
    if figure.per == "layer":
        return list(figure.compute(rows))
    return [row.get(figure.name) for row in rows]


def _mean(values):
    kept = [value for value in values if value is not None]
    return float(np.mean(kept)) if kept else None


def line_value(figure: Figure, line: dict):
    """One value of ``figure`` for a gradflow line (or a report's mode: "layers", "network", ...):
    a line figure's, else its ``of_line``, else the mean over the routing layers of the last
    iteration's value (None where no layer has one)."""
    if figure.per == "line":
        return figure.compute(line)
    if figure.of_line is not None:
        return figure.of_line(line)
    return _mean(layer_values(figure, layer["iterations"])[-1] for layer in line["layers"])


def line_values(line: dict, names) -> dict:
    """{name: ``line_value``} of the named figures for one gradflow line."""
    return {name: line_value(FIGURES[name], line) for name in names}


def _is_number(value) -> bool:
    """A finite int or float (not a bool, not None)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def numbers(record: dict, prefix: str, skip=()):
    """(tag, value) for every finite number in ``record``, nested dicts included: ``prefix/key`` and
    ``prefix/key/inner``; the top-level keys in ``skip`` are left out."""
    for key, value in record.items():
        if key in skip:
            continue
        if isinstance(value, dict):
            yield from numbers(value, f"{prefix}/{key}")
        elif _is_number(value):
            yield f"{prefix}/{key}", value


def tensorboard_scalars(record: dict) -> list:
    """(tag, value) for every number of one gradflow.jsonl line: ``gradflow/<layer>/iteration_<r>/
    <statistic>`` per routing layer and iteration, each tagged figure's ``line_value`` at its tag,
    ``network/...`` for the network's T and D scores (``network/<layer>/...`` per layer),
    ``mode_cosine/<parameter>`` and ``mode_cosine/all``, and ``gradflow/<key>`` for the line's other
    numbers (epoch, batch); its step is the events' step."""
    scalars = []
    for layer in record["layers"]:
        for stats in layer["iterations"]:
            scalars += numbers(stats, f"gradflow/{layer['name']}/iteration_{stats['iteration']}", skip=("iteration",))
    for figure in tagged_figures():
        value = line_value(figure, record)
        if _is_number(value):
            scalars.append((figure.tag, value))
    network = dict(record.get("network") or {})
    per_layer = network.pop("layers", None) or {}
    scalars += numbers(network, "network")
    for name, scores in per_layer.items():
        scalars += numbers(scores, f"network/{name}")
    scalars += numbers(record.get("mode_cosine") or {}, "mode_cosine")
    scalars += numbers(record, "gradflow", skip=("step", "layers", "network", "mode_cosine"))
    return scalars


# ----- the built-in figures -----

def _network(line: dict) -> dict:
    """A line's network scores: as logged, else from its layers (``network_scores``)."""
    return line.get("network") or network_scores(line["layers"])


def _lowest_grad_norm(line: dict):
    norms = path_norms(line["layers"][0]["iterations"])
    return None if norms is None else sum(norms)


def _one_minus_cosine(cosine: float) -> float:
    """1 - cos, with rounding (1 - cos below COSINE_ROUNDING) as 0, which a log axis draws on its floor."""
    return 0.0 if 1.0 - cosine < COSINE_ROUNDING else 1.0 - cosine


def _builtin(figure: Figure) -> None:
    register_figure(figure)
    _BUILTIN.add(figure.name)


QUIET = dict(panel=None, tag=None, study=False)  # drawn, tagged and reported nowhere but the table
D_RANGE = (0.0, 0.5)  # a D-score is a standard deviation of values in [0, 1], so at most 1/2

# per iteration, in the order of the report's and gradflow.jsonl's keys
_builtin(Figure("coupling_entropy", lambda view: 1.0 - view.t_score, "coupling entropy / log J",
                axis_range=(0.0, 1.0), column=Column("entropy", 8, fixed_text), **QUIET))
_builtin(Figure("t_score", lambda view: view.t_score, "T-score (mean over routing layers)", axis_range=(0.0, 1.0),
                log_scale=True, of_line=lambda line: _network(line)["t_score"], axis_label="T-score",
                column=Column("T-score", 10), panel="t_score", tag=None,
                zero_text="T = 0 everywhere: uniform couplings"))
_builtin(Figure("polarization", lambda view: polarization(view.coupling), "polarization (mean largest coupling)",
                axis_range=(0.0, 1.0), column=Column("polar.", 7, functools.partial(fixed_text, digits=3)), **QUIET))
_builtin(Figure("d_score", lambda view: view.d_score, "D-score (hidden layers)", axis_range=D_RANGE,
                of_line=lambda line: _network(line)["d_score"], axis_label="D-score", axis_span="from low",
                column=Column("D-score", 10), panel=None, tag=None, missing_reason="no hidden capsule layer"))
_builtin(Figure("agreement_cosine", lambda view: view.agreement_cosine, "cos(u_hat, v)", axis_range=(-1.0, 1.0),
                column=Column("cos", 7, functools.partial(fixed_text, digits=3)), **QUIET))
_builtin(Figure("grad_norm_sum", lambda view: view.grad_norm("sum"), "|grad u_hat| through the weighted sum",
                log_scale=True, column=Column("|g sum|", 10), **dict(QUIET, panel="paths")))
_builtin(Figure("grad_norm_agreement", lambda view: view.grad_norm("agreement"),
                "|grad u_hat| through the agreement", log_scale=True, column=Column("|g agree|", 10),
                **dict(QUIET, panel="paths")))
# per layer: each path's share of the gradient norms reaching u_hat
_builtin(Figure("share_sum", lambda rows: [s for s, _ in path_shares(rows)], "the weighted sum's share of |grad u_hat|",
                axis_range=(0.0, 1.0), per="layer", column=Column("share sum", 9, share_text), **QUIET))
_builtin(Figure("share_agreement", lambda rows: [a for _, a in path_shares(rows)],
                "the agreement's share of |grad u_hat|", axis_range=(0.0, 1.0), per="layer",
                column=Column("share agr", 9, share_text), **QUIET))
# per line: what studies report besides T and D
NOWHERE_BUT_STUDIES = dict(column=None, panel=None, tag=None)
_builtin(Figure("digit_d_score", lambda line: _network(line)["digit_d_score"], "D of DigitCaps", axis_range=D_RANGE,
                per="line", axis_label="D", axis_span="from low", **NOWHERE_BUT_STUDIES))
_builtin(Figure("inner_share", lambda line: inner_share(line["layers"][-1]["iterations"]),
                "inner iterations' share of |grad u_hat| (DigitCaps)", axis_range=(0.0, 1.0), per="line",
                axis_label="share of |grad u_hat|", missing_reason="no inner iteration: one routing step",
                **NOWHERE_BUT_STUDIES))
_builtin(Figure("lowest_grad_norm", _lowest_grad_norm, "|grad u_hat| of the lowest routing layer", log_scale=True,
                per="line", axis_label="|grad u_hat|", zero_text="all gradients are zero", **NOWHERE_BUT_STUDIES))
_builtin(Figure("mode_cosine", lambda line: (line.get("mode_cosine") or {}).get("all"),
                "cos(full, detach) of the gradient", axis_range=(0.0, 2.0), log_scale=True, per="line",
                axis_label="1 - cos(full, detach)", missing_reason="no mode cosine logged: one gradient mode",
                zero_text="1 - cos < 1e-12 everywhere:\nthe gradients are identical, to rounding",
                floor_label="< 1e-12: identical, to rounding (drawn on this floor)", shown=_one_minus_cosine,
                shown_label="1 - cos(full, detach) of the gradient", **NOWHERE_BUT_STUDIES))
BUILTIN_FIGURES = tuple(FIGURES)
