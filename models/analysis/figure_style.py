"""Drawing conventions shared by the figures, so that none of them hides or misreads a value:
zeros on a log axis drawn on a marked floor (matplotlib drops them), a panel whose values are all
zero says so, coinciding curves stay visible (earlier ones drawn wider, each with its own marker),
whole-number axes get whole-number ticks, and a one-point series gets room and its value written.
A bounded statistic's axis keeps to its range (``bounded_axis``: T and shares in [0, 1], D from 0,
never above 1/2), and a floor says where it is drawn (``floor_label``). A picture's format is
its file's suffix (``PICTURE_SUFFIXES``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
FLOOR_STYLE = dict(color="0.55", linewidth=0.9, linestyle=":")
PICTURE_SUFFIXES = (".png", ".pdf", ".svg")


def picture_format(path) -> str:
    """The matplotlib format of a picture path ("png", "pdf" or "svg"), from its suffix."""
    return Path(path).suffix.lower()[1:]


def series_style(k: int, count: int, points: int) -> dict:
    """Line and marker of the k-th of ``count`` series drawn in turn on one axis, each ``points`` long:
    the earlier the wider, so a later series drawn over an identical one leaves it visible around
    itself; markers (at most about 15 per line) differ from series to series."""
    share = (count - 1 - k) / (count - 1) if count > 1 else 0.0
    return dict(linewidth=1.3 + 3.2 * share, marker=MARKERS[k % len(MARKERS)], markersize=4.5 + 5 * share,
                markevery=max(1, points // 15))


SHOWN_DIGITS = 4  # significant digits a value is shown with (``gradflow``'s table: "%.3e")


def coinciding_labels(series, tolerance: float | None = None, kinds=None, kind: str = "routing") -> list:
    """The labels of ``series`` [(x, values, label, ...)], each one whose values coincide with an
    earlier series' (same x, the same gaps, every value equal where shown: to ``SHOWN_DIGITS``
    significant digits, or within ``tolerance`` relative when one is given) saying so, since a later
    series is drawn over the earlier one it equals and the eye cannot see it:

    - "(= EARLIER)" only where the whole curves coincide: two or more points shown, and the two
      series of the same kind (``kinds``: one key per series, e.g. each configuration's routing;
      None: all of one kind);
    - "(same values as EARLIER)" where a single point is shown (one value is not a curve);
    - "(same values as EARLIER, another KIND)" for series of different kinds: two routings whose
      values happen to agree (both at chance accuracy, say) are not the same curve."""
    labels = []
    for k, (x, values, label, *_) in enumerate(series):
        for j in range(k):
            other_x, other, other_label = series[j][0], series[j][1], series[j][2]
            if list(x) == list(other_x) and _close(values, other, tolerance):
                if kinds is not None and kinds[k] != kinds[j]:
                    label = f"{label} (same values as {other_label}, another {kind})"
                elif sum(v is not None for v in values) >= 2:
                    label = f"{label} (= {other_label})"
                else:
                    label = f"{label} (same values as {other_label})"
                break
        labels.append(label)
    return labels


def shown_equal(u: float, v: float, digits: int = SHOWN_DIGITS) -> bool:
    """Whether ``u`` and ``v`` read the same with ``digits`` significant digits (a value and its
    negative zero alike)."""
    return u == v or f"{u:.{digits - 1}e}" == f"{v:.{digits - 1}e}"


def _close(a, b, tolerance) -> bool:
    """Whether two series of values (None for a gap) coincide: the same gaps, and every value equal
    where shown (``tolerance`` None) or within ``tolerance`` relative."""
    if len(a) != len(b):
        return False
    for u, v in zip(a, b):
        if (u is None) != (v is None):
            return False
        if u is None:
            continue
        if tolerance is None:
            if not shown_equal(u, v):
                return False
        elif abs(u - v) > tolerance * max(abs(u), abs(v)):
            return False
    return True


def finite_positive(values) -> list:
    """The entries of ``values`` that are finite numbers > 0."""
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def log_floor(values):
    """Where a log axis draws the zeros of ``values``: the decade below the smallest positive value
    (None when no value is positive: the panel then has nothing a log axis can show)."""
    positive = finite_positive(values)
    if not positive:
        return None
    return 10.0 ** (math.floor(math.log10(min(positive))) - 1)


def on_log_axis(values, floor) -> np.ndarray:
    """``values`` as a log axis draws them: zeros (and negatives) at ``floor``, None as a gap."""
    return np.array([np.nan if v is None else (v if v > 0 else floor) for v in values], dtype=np.float64)


def power_of_ten(value: float) -> str:
    """A power of ten as a legend writes it: 1e-05 -> "1e-5", 0.01 -> "1e-2", 1.0 -> "1e0"."""
    return f"1e{round(math.log10(value))}"


def floor_label(label: str, floor: float) -> str:
    """A floor's legend entry saying where it is drawn: "0 (drawn on this floor), at 1e-5"."""
    return f"{label}, at {power_of_ten(floor)}"


def mark_floor(ax, floor, label: str = "0 (drawn on this floor)") -> None:
    """A dotted line at ``floor`` with a legend entry saying that points on it stand for ``label``
    (zeros, or values below a rounding threshold) and where the floor lies (``floor_label``)."""
    ax.axhline(floor, label=floor_label(label, floor), **FLOOR_STYLE)


SPANS = ("range", "from low", "data")


def bounded_axis(ax, low: float, high: float, values=(), axis: str = "y", span: str = "range") -> None:
    """Keep ``ax``'s ``axis`` ("x" or "y") to the range [low, high] of the statistic it draws
    (``values``: the values drawn). ``span``: "range" draws the whole range (on a log axis: up to
    ``high``, the bottom left at the floor); "from low" starts at ``low`` and ends where matplotlib's
    view of the data does, at most ``high`` (a statistic whose values use a small part of its range,
    such as a D-score); "data" keeps matplotlib's view, cut to the range (an accuracy). A value
    drawn beyond the range (an error upstream) widens the axis rather than hide. Lines are drawn
    unclipped, so that a marker on a bound shows whole."""
    if span not in SPANS:
        raise ValueError(f"bounded_axis: span must be one of {', '.join(SPANS)}, got {span!r}")
    finite = [v for v in values if v is not None and math.isfinite(v)]
    low, high = min([low, *finite]), max([high, *finite])
    log = (ax.get_xscale() if axis == "x" else ax.get_yscale()) == "log"
    get, set_ = (ax.get_xlim, ax.set_xlim) if axis == "x" else (ax.get_ylim, ax.set_ylim)
    bottom, top = get()
    if log:
        set_(bottom, high if span == "range" else min(top, high))
    elif span == "range":
        set_(low, high)
    else:
        set_(low if span == "from low" else max(bottom, low), min(top, high))
    for line in ax.lines:
        line.set_clip_on(False)


def say_all_zero(ax, text: str, height: float = 0.5) -> None:
    """Write ``text`` across the panel at ``height`` (a fraction of it; its values are all zero)."""
    ax.text(0.5, height, text, transform=ax.transAxes, ha="center", va="center", fontsize=11, color="0.25",
            bbox=dict(boxstyle="round", facecolor="white", edgecolor="0.7"))


def integer_ticks(axis) -> None:
    """Ticks only at whole numbers on ``axis`` (ax.xaxis or ax.yaxis)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def single_point_room(ax, x) -> None:
    """With one x value, widen the x axis to half a unit around it (matplotlib would show +-4%)."""
    if len(set(x)) == 1:
        ax.set_xlim(x[0] - 0.5, x[0] + 0.5)


def write_values(ax, x, y, fmt: str = "{:.4g}") -> None:
    """Write each finite value of a short series beside its point."""
    for xi, yi in zip(x, y):
        if yi is not None and math.isfinite(yi):
            ax.annotate(fmt.format(yi), (xi, yi), textcoords="offset points", xytext=(6, 0), va="center", fontsize=8)


def no_negative_zero(text: str) -> str:
    """A formatted number without the sign of a rounded zero: "-0.00" -> "0.00", "+0.00" -> "0.00"."""
    stripped = text.lstrip("+-")
    return stripped if stripped.replace("0", "").replace(".", "") == "" else text
