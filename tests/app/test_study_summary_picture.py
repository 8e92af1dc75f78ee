"""summary.png's accuracy panels on the matplotlib objects (not pixels): a mean's interval is drawn
clipped to [0, 1] and says so where it is clipped (2-seed Student-t intervals reach beyond it), and
the chance level 1 / classes is a labelled line on both accuracy panels; the summary's number of
classes comes from the runs' config.json."""
import json

import pytest

from tinygrad_caps.models.analysis.confidence import mean_and_spread
from tinygrad_caps.models.app.studies.plan import StudyPlan
from tinygrad_caps.models.app.studies.summary import study_classes, summarize

pytest.importorskip("matplotlib")

TOL = 1e-12  # absolute tolerance of the drawn coordinates (the figure's own arithmetic on floats)
CLIPPED = "interval clipped to [0, 1]"


def row(config_id, values):
    """A summary row with the real Student-t interval of ``values`` (as ``summarize`` computes it)."""
    spread = mean_and_spread(list(values))
    return {"config_id": config_id, "config": {}, "n": spread["n"], "seeds": list(range(len(values))),
            "values": list(values), "mean": spread["mean"], "std": spread["std"], "ci95": spread["ci95"],
            "metrics": {}, "curves": {"learning": {"epoch": [1, 2], "test_accuracy": [0.3, spread["mean"]]},
                                      "gradflow": {}}}


def summary(rows, classes=10):
    made = {"study": "made-up", "metric": "test_accuracy", "epochs": 2, "complete": True,
            "runs_finished": sum(r["n"] for r in rows), "runs_planned": sum(r["n"] for r in rows), "figures": [],
            "rows": rows, "comparisons": []}
    if classes is not None:
        made["classes"] = classes
    return made


def figure(made):
    from tinygrad_caps.models.analysis.study_figures import study_summary_figure
    return study_summary_figure(made)


def panel(fig, title_start):
    return next(ax for ax in fig.axes if ax.get_title().startswith(title_start))


def interval_ends(ax, k):
    """The x ends of the horizontal error bar drawn on row ``k`` of the accuracy panel."""
    for container in ax.containers:
        (segments,) = container.lines[2]  # the bar's LineCollection: one segment per point
        (x0, y0), (x1, _) = segments.get_segments()[0]
        if abs(y0 - k) <= TOL:
            return min(x0, x1), max(x0, x1)
    raise AssertionError(f"no interval drawn on row {k}")


def clip_markers(ax):
    """{(x, row): marker} of the triangles that mark a clipped end."""
    return {(float(line.get_xdata()[0]), float(line.get_ydata()[0])): line.get_marker()
            for line in ax.lines if line.get_marker() in ("<", ">")}


def legend_texts(ax):
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def test_two_seed_intervals_beyond_0_1_are_drawn_clipped_and_marked_where_they_are_clipped():
    rows = [row("steady", (0.78, 0.80, 0.79)), row("both-sides", (0.05, 0.25)), row("above", (0.55, 0.63)),
            row("below", (0.02, 0.10))]
    raw = [r["ci95"] for r in rows]
    assert 0.0 < raw[0][0] and raw[0][1] < 1.0  # the cases are what they claim to be
    assert raw[1][0] < -0.5 and raw[1][1] > 1.2  # a 2-seed t interval (t = 12.7) past both ends
    assert 0.0 < raw[2][0] and raw[2][1] > 1.0 and raw[3][0] < 0.0 and raw[3][1] < 1.0
    ax = panel(figure(summary(rows)), "mean, 95%")
    expected = [tuple(raw[0]), (0.0, 1.0), (raw[2][0], 1.0), (0.0, raw[3][1])]
    for k, (low, high) in enumerate(expected):
        drawn = interval_ends(ax, k)
        assert drawn == pytest.approx((low, high), abs=TOL), rows[k]["config_id"]
        assert -TOL <= drawn[0] and drawn[1] <= 1.0 + TOL
    assert clip_markers(ax) == {(0.0, 1.0): "<", (1.0, 1.0): ">", (1.0, 2.0): ">", (0.0, 3.0): "<"}
    assert legend_texts(ax).count(CLIPPED) == 1  # one legend entry however many ends were clipped
    low, high = ax.get_xlim()
    assert low > -0.2 and high < 1.2  # the axis is not stretched to the unclipped interval


def test_no_clipping_note_where_every_interval_lies_in_0_1():
    rows = [row("a", (0.78, 0.80, 0.79)), row("b", (0.40, 0.45, 0.50)), row("one-seed", (0.6,))]
    ax = panel(figure(summary(rows)), "mean, 95%")
    assert interval_ends(ax, 1) == pytest.approx(tuple(rows[1]["ci95"]), abs=TOL)
    assert interval_ends(ax, 2) == pytest.approx((0.6, 0.6), abs=TOL)  # one seed: no interval
    assert clip_markers(ax) == {}
    assert CLIPPED not in legend_texts(ax) and legend_texts(ax) == ["chance (1/10)"]


def chance_lines(ax):
    return [line for line in ax.lines if line.get_label().startswith("chance")]


@pytest.mark.parametrize("classes, level", [(10, 0.1), (3, 1.0 / 3.0)])
def test_the_chance_level_is_a_labelled_line_on_both_accuracy_panels(classes, level):
    from tinygrad_caps.models.analysis.study_figures import study_summary_figure
    made = summary([row("a", (0.78, 0.80, 0.79)), row("b", (0.1, 0.3))], classes=classes)
    made.update(figures=["t_score"])  # a gradient-flow panel, which is no accuracy panel
    for r in made["rows"]:
        r["curves"]["gradflow"] = {"step": [10, 20], "t_score": [0.1, 0.2]}
    fig = study_summary_figure(made)
    label = f"chance (1/{classes})"
    (bars,) = chance_lines(panel(fig, "mean, 95%"))  # the accuracy is the x axis: a vertical line
    assert bars.get_label() == label and list(bars.get_xdata()) == pytest.approx([level, level], abs=TOL)
    assert label in legend_texts(panel(fig, "mean, 95%"))
    (curves,) = chance_lines(panel(fig, "learning curves"))  # the accuracy is the y axis: a horizontal line
    assert curves.get_label() == label and list(curves.get_ydata()) == pytest.approx([level, level], abs=TOL)
    assert label in legend_texts(panel(fig, "learning curves"))
    assert not chance_lines(panel(fig, "T-score"))


def test_no_chance_line_without_a_number_of_classes_nor_on_an_empty_panel():
    fig = figure(summary([row("a", (0.78, 0.80, 0.79))], classes=None))
    assert not any(chance_lines(ax) for ax in fig.axes)
    unfinished = row("a", (0.5,))
    unfinished.update(n=0, values=[], mean=None, std=None, ci95=None, curves={"learning": {}, "gradflow": {}})
    fig = figure(summary([unfinished]))
    assert not any(ax.lines for ax in fig.axes)


def write_study(out, classes_by_run):
    """A study folder by hand: study.json and, per run, config.json (``num_classes`` or none) and a
    finished epoch in metrics.jsonl; returns its plan (a StudyPlan)."""
    configs = []
    for k, classes in enumerate(classes_by_run):
        path = f"runs/c{k}/seed-0"
        (out / path).mkdir(parents=True)
        if classes is not None:
            (out / path / "config.json").write_text(json.dumps({"num_classes": classes, "model": "capsnet"}))
        (out / path / "metrics.jsonl").write_text(json.dumps(
            {"epoch": 1, "train_loss": 0.5, "test_loss": 0.6, "train_accuracy": 0.7, "test_accuracy": 0.6}) + "\n")
        configs.append({"config_id": f"c{k}", "options": {"digit_dim": 4 + k}, "runs": [{"seed": 0, "path": path}]})
    plan = {"study": "made-up", "options": {}, "seeds": [0], "epochs": 1, "configs": configs}
    (out / "study.json").write_text(json.dumps(plan))
    return StudyPlan.from_json(plan)


@pytest.mark.parametrize("classes_by_run, expected", [([10, 10], 10), ([3, None], 3), ([10, 3], None),
                                                      ([None, None], None), ([True, 0], None)])
def test_the_summary_takes_the_number_of_classes_from_the_runs_config(tmp_path, classes_by_run, expected):
    plan = write_study(tmp_path, classes_by_run)
    assert study_classes(tmp_path, plan) == expected
    made = summarize(tmp_path)
    assert made["classes"] == expected and made["runs_finished"] == len(classes_by_run)


def test_an_unreadable_config_json_gives_no_number_of_classes(tmp_path):
    plan = write_study(tmp_path, [None])
    (tmp_path / "runs" / "c0" / "seed-0" / "config.json").write_text("[not json")
    assert study_classes(tmp_path, plan) is None
