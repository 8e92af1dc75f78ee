"""Pictures that do not mislead, read on the matplotlib objects (axis limits, line y-values, legend
texts), not pixels: every bounded statistic keeps to its range (T and shares in [0, 1], D from 0 and
never above 1/2, accuracy never beyond [0, 1], the cosine in [-1, 1]), a log panel's floor is drawn
where its legend says it is, and "(= OTHER)" marks only whole coinciding curves of one routing.
Covers ``tinygrad-caps plot`` (run_figure), gradflow.png (gradflow_figure) and a study's summary.png
(study_summary_figure, also from a study folder written by hand)."""
import json
import re

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from tinygrad_caps.models.analysis.plots import gradflow_figure, run_figure  # noqa: E402
from tinygrad_caps.models.analysis.study_figures import study_summary_figure  # noqa: E402
from tinygrad_caps.models.app.studies.summary import summarize, write_summary  # noqa: E402

TOL = 1e-12
FLOOR_AT = re.compile(r", at 1e(-?\d+)$")


@pytest.fixture(autouse=True)
def close_figures():
    """Each test's figures closed after it (pyplot keeps every figure it made open)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def metrics_line(epoch, accuracy=0.5):
    return {"epoch": epoch, "train_loss": 0.8, "test_loss": 0.79, "train_accuracy": accuracy,
            "test_accuracy": accuracy, "lr": 1e-3, "seconds": 1.0}


def gradflow_line(step, entropies=(1.0, 1.0, 1.0)):
    """A gradflow.jsonl line of one routing layer with three iterations and these coupling entropies."""
    rows = [{"iteration": r, "coupling_entropy": e, "t_score": 1.0 - e, "d_score": 0.01,
             "grad_norm_sum": 10.0 ** (-6 + 2 * r), "grad_norm_agreement": None if r == 2 else 1e-7}
            for r, e in enumerate(entropies)]
    return {"epoch": 1, "batch": step, "step": step, "mode": "full", "layers": [{"name": "digit", "iterations": rows}]}


def legend_texts(ax):
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def panel(fig, title_start):
    return next(ax for ax in fig.axes if ax.get_title().startswith(title_start))


def floors(ax):
    """[(label, y)] of the dotted floor lines of a log panel."""
    return [(line.get_label(), float(line.get_ydata()[0])) for line in ax.lines if "floor" in line.get_label()]


def assert_floor_where_its_legend_says(ax):
    """The panel has one floor, its legend entry says "at 1eN", and the line lies at 10^N."""
    (label, y), = floors(ax)
    assert label in legend_texts(ax)
    found = FLOOR_AT.search(label)
    assert found, label
    assert y == pytest.approx(10.0 ** int(found.group(1)), rel=1e-12)
    low, high = ax.get_ylim()
    assert low <= y <= high
    return y


def drawn_y(ax, label_start):
    line = next(line for line in ax.lines if line.get_label().startswith(label_start))
    return np.asarray(line.get_ydata(), dtype=np.float64)


# ----- tinygrad-caps plot -----

def test_plot_of_uniform_couplings_draws_t_on_0_to_1_not_minus_1_to_1():
    lines = [gradflow_line(step) for step in (1, 2, 3)]  # T = 0 at every iteration and step
    entropy = run_figure([metrics_line(1)], lines).axes[3]
    assert entropy.get_yscale() == "linear"
    assert entropy.get_ylim() == pytest.approx((0.0, 1.0), abs=TOL)
    assert all(set(line.get_ydata()) == {0.0} for line in entropy.lines)
    assert all(not line.get_clip_on() for line in entropy.lines)  # a marker on the bound shows whole


def test_plot_of_a_gradient_that_is_zero_everywhere_draws_it_on_0_to_1():
    lines = [gradflow_line(step) for step in (1, 2)]
    for line in lines:
        for row in line["layers"][0]["iterations"]:
            row["grad_norm_sum"], row["grad_norm_agreement"] = 0.0, None if row["grad_norm_agreement"] is None else 0.0
    paths = run_figure([metrics_line(1)], lines).axes[2]
    assert paths.get_ylim() == pytest.approx((0.0, 1.0), abs=TOL)  # a norm is >= 0: not [-1, 1]


def test_plot_draws_t_on_a_log_axis_that_ends_at_1_with_the_floor_where_the_legend_says():
    lines = [gradflow_line(step, (1.0, 1.0 - 1e-9 * step, 0.4)) for step in (1, 2, 3)]  # r = 0 uniform: T = 0
    entropy = run_figure([metrics_line(1), metrics_line(2)], lines).axes[3]
    assert entropy.get_yscale() == "log"
    low, high = entropy.get_ylim()
    assert high == pytest.approx(1.0, abs=TOL) and low > 0
    floor = assert_floor_where_its_legend_says(entropy)
    assert floor < 1e-9 * 0.999  # a decade below the smallest positive T
    assert set(drawn_y(entropy, "r=0")) == {floor}  # the zeros, on the floor the legend names
    assert any(label.startswith("<= 0: uniform, to rounding (drawn on this floor), at 1e-") for label in legend_texts(entropy))


@pytest.mark.parametrize("accuracies", [(0.97, 1.0, 1.0), (0.0, 0.02, 0.0)])
def test_plot_keeps_an_accuracy_axis_inside_0_1(accuracies):
    fig = run_figure([metrics_line(e + 1, a) for e, a in enumerate(accuracies)], [])
    low, high = fig.axes[1].get_ylim()
    assert 0.0 - TOL <= low < min(accuracies) + TOL and max(accuracies) - TOL <= high <= 1.0 + TOL


def test_gradflow_picture_keeps_t_to_1_and_the_cosine_to_minus_1_1():
    rows = [{"iteration": r, "coupling_entropy": 1.0 - t, "grad_norm_sum": 1e-3 * (r + 1),
             "grad_norm_agreement": None if r == 1 else 1e-4} for r, t in enumerate((0.0, 0.3))]
    mode = {"layers": [{"name": "digit", "iterations": rows}], "parameter_grad_norms": {"digit.weight": 0.5}}
    report = {"modes": {"full": mode, "detach": json.loads(json.dumps(mode))}, "mode_cosine": {"all": 1.0}}
    paths, entropy, _, cosine = gradflow_figure(report).axes
    assert entropy.get_yscale() == "log" and entropy.get_ylim()[1] == pytest.approx(1.0, abs=TOL)
    assert_floor_where_its_legend_says(entropy)
    assert cosine.get_ylim() == pytest.approx((-1.0, 1.0), abs=TOL)


# ----- a study's summary.png -----

def row(config_id, routing=None, learning=(0.4, 0.6), steps=(10, 20, 30), n=2, **curves):
    """A summary row: two finished seeds, its learning curve and its gradient-flow curves."""
    mean = learning[-1]
    return {"config_id": config_id, "config": {} if routing is None else {"routing": routing}, "n": n,
            "seeds": list(range(n)), "values": [mean] * n, "mean": mean, "std": 0.0, "ci95": [mean, mean],
            "metrics": {}, "curves": {"learning": {"epoch": list(range(1, len(learning) + 1)), "test_accuracy": list(learning)},
                                      "gradflow": {"step": list(steps), **{k: list(v) for k, v in curves.items()}}}}


def summary(rows, figures):
    return {"study": "made-up", "metric": "test_accuracy", "epochs": len(rows[0]["curves"]["learning"]["epoch"]),
            "complete": True, "runs_finished": sum(r["n"] for r in rows), "runs_planned": sum(r["n"] for r in rows),
            "figures": list(figures), "rows": rows, "comparisons": [], "classes": 3}


def test_the_inner_share_axis_is_0_to_1_even_with_a_note_of_what_it_does_not_draw():
    rows = [row("routing3", inner_share=(0.95, 0.97, 0.99)), row("routing3-detach", inner_share=(0.0, 0.0, 0.0)),
            row("one-step", routing="self-routing", inner_share=(None, None, None)),
            row("also-one-step", routing="self-attention", inner_share=(None, None, None))]
    fig = study_summary_figure(summary(rows, ["inner_share"]))
    inner = panel(fig, "inner iterations")
    assert inner.get_ylim() == pytest.approx((0.0, 1.0), abs=TOL)  # was 1.6: raised to make room for the note
    (note,) = [t for t in inner.texts if t.get_text().startswith("not drawn")]
    assert "one-step, also-one-step (no inner iteration: one routing step)" in note.get_text().replace("\n", " ")
    fig.canvas.draw()  # the note covers no curve: the values span the panel, so it sits under the x axis
    assert note.get_window_extent().y1 <= inner.get_window_extent().y0
    assert list(drawn_y(inner, "routing3-detach")) == [0.0, 0.0, 0.0]


def test_t_and_d_panels_keep_to_their_ranges():
    rows = [row("a", t_score=(0.0, 1e-6, 1e-3), digit_d_score=(0.01, 0.02, 0.03), d_score=(0.1, 0.2, 0.3)),
            row("uniform", routing="uniform", t_score=(0.0, 0.0, 0.0), digit_d_score=(0.0, 0.0, 0.0),
                d_score=(None, None, None))]
    fig = study_summary_figure(summary(rows, ["t_score", "digit_d_score", "d_score"]))
    t_panel = panel(fig, "T-score")
    assert t_panel.get_yscale() == "log" and t_panel.get_ylim()[1] == pytest.approx(1.0, abs=TOL)
    floor = assert_floor_where_its_legend_says(t_panel)
    assert floor == pytest.approx(1e-7, rel=1e-12) and set(drawn_y(t_panel, "uniform")) == {floor}
    for title in ("D of DigitCaps", "D-score"):
        low, high = panel(fig, title).get_ylim()
        assert low == pytest.approx(0.0, abs=TOL) and high <= 0.5  # a standard deviation of values in [0, 1]
    assert panel(fig, "D-score").get_ylim()[1] >= 0.3


def test_t_of_uniform_couplings_everywhere_is_drawn_on_0_to_1():
    rows = [row("uniform", routing="uniform", t_score=(0.0, 0.0, 0.0))]
    t_panel = panel(study_summary_figure(summary(rows, ["t_score"])), "T-score")
    assert t_panel.get_yscale() == "linear" and t_panel.get_ylim() == pytest.approx((0.0, 1.0), abs=TOL)
    assert any("uniform couplings" in t.get_text() for t in t_panel.texts)


def test_the_cosine_floor_is_drawn_where_its_legend_says():
    rows = [row("routing1", mode_cosine=(1.0, 1.0, 1.0)), row("routing3", mode_cosine=(1 - 1e-4, 1 - 1e-5, 1 - 1e-6))]
    cosine = panel(study_summary_figure(summary(rows, ["mode_cosine"])), "1 - cos")
    floor = assert_floor_where_its_legend_says(cosine)
    assert floor == pytest.approx(1e-7, rel=1e-12)  # a decade below the smallest 1 - cos (1e-6), not 1e-12
    (label, _), = floors(cosine)
    assert label == "< 1e-12: identical, to rounding (drawn on this floor), at 1e-7"
    assert set(drawn_y(cosine, "routing1")) == {floor}
    assert cosine.get_ylim()[1] <= 2.0 + TOL  # 1 - cos lies in [0, 2]


def test_equal_marks_only_whole_curves_of_one_routing():
    flat = (0.3333, 0.3333)
    rows = [row("self-routing", routing="self-routing", learning=flat),
            row("self-attention-authors", routing="self-attention", learning=flat),  # another routing, same values
            row("self-routing-authors", routing="self-routing", learning=flat),  # same routing, whole curve
            row("dynamic", routing="dynamic", learning=(0.5, 0.6)),
            row("dynamic-detach", routing="dynamic", learning=(0.5, 0.61))]  # differs at one epoch: no mark
    labels = panel(study_summary_figure(summary(rows, [])), "learning curves").get_legend_handles_labels()[1]
    assert labels[:5] == ["self-routing", "self-attention-authors (same values as self-routing, another routing)",
                          "self-routing-authors (= self-routing)", "dynamic", "dynamic-detach"]


def test_one_epoch_curves_that_meet_are_same_values_never_equal():
    rows = [row("dynamic-full", routing="dynamic", learning=(0.5,)), row("dynamic-detach", routing="dynamic", learning=(0.5,)),
            row("uniform", routing="uniform", learning=(0.5,))]
    labels = panel(study_summary_figure(summary(rows, [])), "learning curves").get_legend_handles_labels()[1]
    assert labels[:3] == ["dynamic-full", "dynamic-detach (same values as dynamic-full)",
                          "uniform (same values as dynamic-full, another routing)"]
    assert not any("(= " in label for label in labels)


@pytest.mark.parametrize("learning", [(0.98, 1.0), (0.0, 0.01)])
def test_accuracy_panels_never_leave_0_1(learning):
    fig = study_summary_figure(summary([row("a", learning=learning), row("b", learning=learning[::-1])], []))
    low, high = panel(fig, "learning curves").get_ylim()
    assert -TOL <= low and high <= 1.0 + TOL
    low, high = panel(fig, "mean, 95%").get_xlim()
    assert -TOL <= low and high <= 1.0 + TOL


def write_study(out):
    """A finished two-configuration study by hand: study.json, and per run config.json, a
    metrics.jsonl of two epochs at chance and a gradflow.jsonl whose T is 0 at the first logged step."""
    configs = []
    for config_id, routing, cosine in (("dynamic", "dynamic", 1.0), ("self-routing", "self-routing", 1.0 - 1e-5)):
        path = f"runs/{config_id}/seed-0"
        folder = out / path
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"num_classes": 3, "routing": routing}))
        (folder / "metrics.jsonl").write_text("".join(json.dumps(metrics_line(e, 1 / 3)) + "\n" for e in (1, 2)))
        lines = [dict(gradflow_line(step, (1.0, 1.0, 1.0 - 0.1 * k)), epoch=1 + k // 2, mode_cosine={"all": cosine})
                 for k, step in enumerate((5, 10, 15, 20))]
        (folder / "gradflow.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        configs.append({"config_id": config_id, "options": {"routing": routing}, "runs": [{"seed": 0, "path": path}]})
    (out / "study.json").write_text(json.dumps({"study": "made-up", "options": {}, "seeds": [0], "epochs": 2,
                                                "configs": configs}))


def test_a_study_folder_summary_png_keeps_its_ranges_floors_and_marks(tmp_path):
    from PIL import Image

    write_study(tmp_path)
    figures = ["t_score", "inner_share", "mode_cosine", "digit_d_score"]
    written = write_summary(tmp_path, figures)
    assert str(tmp_path / "summary.png") in written["written"]
    with Image.open(tmp_path / "summary.png") as image:
        assert image.size[0] <= 1400 and image.size[1] > 600
    fig = study_summary_figure(summarize(tmp_path, figures))
    learning = panel(fig, "learning curves").get_legend_handles_labels()[1]
    assert "self-routing (same values as dynamic, another routing)" in learning  # both at chance, 2 epochs
    t_panel = panel(fig, "T-score")
    assert t_panel.get_ylim()[1] == pytest.approx(1.0, abs=TOL)
    floor = assert_floor_where_its_legend_says(t_panel)
    assert floor == pytest.approx(1e-2, rel=1e-12)  # a decade below the smallest positive T (0.1)
    assert panel(fig, "inner iterations").get_ylim() == pytest.approx((0.0, 1.0), abs=TOL)
    assert_floor_where_its_legend_says(panel(fig, "1 - cos"))


def test_a_study_run_keeps_the_picture_of_an_unchanged_summary_and_draws_a_changed_one(tmp_path, monkeypatch):
    """``study run`` (redraw=False) does not draw summary.png again where it holds the digest of the
    summary at hand (a resume with nothing to do, a job-script loop's calls between two finished
    runs); a changed summary, a damaged or foreign picture, and ``study summary`` draw it."""
    from tinygrad_caps.models.analysis import study_figures
    from tinygrad_caps.models.app.studies import summary as summary_module

    drawn = []
    draw = study_figures.plot_study_summary
    monkeypatch.setattr(summary_module, "plot_study_summary", lambda *a: drawn.append(1) or draw(*a))
    write_study(tmp_path)
    figures = ["t_score"]
    picture = tmp_path / "summary.png"
    assert str(picture) in write_summary(tmp_path, figures, redraw=False)["written"] and len(drawn) == 1
    digest = study_figures.png_text(picture.read_bytes())[study_figures.DIGEST_KEY]
    assert digest == study_figures.summary_picture_digest(summarize(tmp_path, figures))
    assert str(picture) in write_summary(tmp_path, figures, redraw=False)["unchanged"] and len(drawn) == 1
    assert str(picture) in write_summary(tmp_path, figures)["unchanged"] and len(drawn) == 2  # study summary draws
    metrics = tmp_path / "runs" / "dynamic" / "seed-0" / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(metrics_line(e, 0.5)) + "\n" for e in (1, 2)))  # no longer at chance
    assert str(picture) in write_summary(tmp_path, figures, redraw=False)["written"] and len(drawn) == 3
    picture.write_bytes(picture.read_bytes()[:-20])  # damaged: its digest no longer counts
    assert study_figures.png_text(picture.read_bytes()) == {}
    assert str(picture) in write_summary(tmp_path, figures, redraw=False)["written"] and len(drawn) == 4
