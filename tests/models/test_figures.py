"""The figures registry (``tinygrad_caps.models.analysis.figures``): the built-in entries give the
numbers, texts and tags their consumers gave when each kept its own list (the gradflow table,
a study's figures, TensorBoard's tags), and a new statistic is one ``Figure`` entry: registered
here, it reaches the gradflow table's columns, ``plot``'s panels, a study's figures and summary, and
its TensorBoard tag, with no other file touched."""
import importlib
import json

import numpy as np
import pytest

import tinygrad_caps as tc
from cli_helpers import TINY, tiny_data_dir
from tinygrad_caps.models import CapsNet, cli, dynamic_routing, em_routing, gradient_flow_report
from tinygrad_caps.models.analysis.figures import (BUILTIN_FIGURES, FIGURES, Column, Figure, line_value, line_values,
                                                   plot_panels, register_figure, study_figure_names, table_columns,
                                                   tensorboard_scalars, unregister_figure)
from tinygrad_caps.models.analysis.routing_statistics import (STATISTICS, activation_d_score, agreement_cosine,
                                                              d_score, inner_share, network_scores, path_norms,
                                                              path_shares, polarization, routing_statistics,
                                                              t_score)
from tinygrad_caps.models.app.cli.gradflow import format_report
from tinygrad_caps.models.app.studies.registry import STUDIES, register_study

statistics_module = importlib.import_module("tinygrad_caps.models.analysis.routing_statistics")

# What the consumers listed before the registry: the report's keys, the study figures
# (studies/registry.GRADFLOW_FIGURES) and the gradflow table's header (cli/gradflow.format_report).
ITERATION_KEYS = ("coupling_entropy", "t_score", "polarization", "d_score", "agreement_cosine", "grad_norm_sum",
                  "grad_norm_agreement")
STUDY_FIGURES = ("t_score", "d_score", "digit_d_score", "inner_share", "lowest_grad_norm", "mode_cosine")
TABLE_HEADER = "   r  entropy    T-score  polar.    D-score     cos    |g sum|  |g agree| share sum share agr"


def dynamic_trace(seed=0, gradient="full"):
    """A dynamic-routing trace of 3 iterations after a backward, its gradients retained."""
    rng = np.random.default_rng(seed)
    u_hat = tc.tensor(0.3 * rng.standard_normal((4, 6, 3, 2)), requires_grad=True)
    v, trace = dynamic_routing(u_hat, iterations=3, gradient=gradient, trace=True)
    trace.retain_grad()
    tc.functional.sum((v - tc.tensor(0.1 * rng.standard_normal((4, 3, 2)))) ** 2).backward()
    return trace


def em_trace(seed=0):
    """An EM-routing trace (output activations: D from them; no dot-product agreement)."""
    rng = np.random.default_rng(seed)
    u_hat = tc.tensor(rng.standard_normal((4, 6, 3, 2)), requires_grad=True)
    a = tc.tensor(rng.uniform(0.2, 1.0, (4, 6)))
    poses, activations, trace = em_routing(u_hat, a, tc.tensor(np.zeros(3)), tc.tensor(np.zeros(3)), 3, trace=True)
    trace.retain_grad()
    (tc.functional.sum(poses ** 2) + tc.functional.sum(activations)).backward()
    return trace


def norm_of(t):
    """|t.grad| (0.0 for a detached use, None where no gradient was kept)."""
    if not t.requires_grad:
        return 0.0
    return None if t.grad is None else float(np.linalg.norm(t.grad.numpy().ravel()))


def expected_statistics(trace) -> dict:
    """Each statistic of every iteration from the statistic functions themselves, the way
    ``routing_statistics`` computed them before they came from the registry."""
    from_activations = trace.activations and len(trace.activations) == len(trace.outputs)
    rows = {name: [] for name in ITERATION_KEYS}
    for r, c in enumerate(trace.coupling):
        rows["t_score"].append(t_score(c))
        rows["coupling_entropy"].append(1.0 - t_score(c))
        rows["polarization"].append(polarization(c))
        rows["d_score"].append(activation_d_score(trace.activations[r]) if from_activations
                               else d_score(trace.outputs[r]))
        rows["agreement_cosine"].append(agreement_cosine(trace.u_hat_sum[r], trace.outputs[r]))
        rows["grad_norm_sum"].append(norm_of(trace.u_hat_sum[r]))
        rows["grad_norm_agreement"].append(norm_of(trace.u_hat_agreement[r]) if r < len(trace.u_hat_agreement)
                                           else None)
    return rows


@pytest.fixture
def figures_kept():
    """FIGURES and STUDIES as they were, after the test."""
    figures, studies = dict(FIGURES), dict(STUDIES)
    yield
    FIGURES.clear()
    FIGURES.update(figures)
    STUDIES.clear()
    STUDIES.update(studies)


def test_the_built_in_entries_keep_the_order_and_names_each_consumer_had():
    assert BUILTIN_FIGURES == (*ITERATION_KEYS, "share_sum", "share_agreement", "digit_d_score", "inner_share",
                               "lowest_grad_norm", "mode_cosine")
    assert tuple(FIGURES)[:len(BUILTIN_FIGURES)] == BUILTIN_FIGURES
    assert STATISTICS == ITERATION_KEYS == tuple(routing_statistics(dynamic_trace()))
    assert study_figure_names() == STUDY_FIGURES
    assert [figure.name for figure in table_columns()] == [*ITERATION_KEYS, "share_sum", "share_agreement"]
    assert {name: [f.name for f in figures] for name, figures in plot_panels().items()} == {
        "t_score": ["t_score"], "paths": ["grad_norm_sum", "grad_norm_agreement"]}
    assert [figure.tag for figure in FIGURES.values()] == [None] * len(FIGURES)  # no tag beyond today's


@pytest.mark.parametrize("trace", [dynamic_trace, lambda: dynamic_trace(1, "detach"), em_trace],
                         ids=["dynamic-full", "dynamic-detach", "em"])
def test_each_iteration_entry_gives_the_value_of_its_statistic(trace):
    trace = trace()
    measured, expected = routing_statistics(trace), expected_statistics(trace)
    assert list(measured) == list(ITERATION_KEYS)
    for name in ITERATION_KEYS:
        # pytest.approx of a None (an iteration without the statistic) is a TypeError on some pytest versions
        got, want = measured[name], expected[name]
        assert [v is None for v in got] == [v is None for v in want], name
        assert [v for v in got if v is not None] == pytest.approx([v for v in want if v is not None],
                                                                  rel=1e-12, abs=1e-15), name
    assert measured["t_score"] == [t_score(c) for c in trace.coupling]  # the same float, not a close one


def old_line_figures(line: dict) -> dict:
    """The study figures of one gradflow line as studies/summary.line_figures gave them."""
    network = line.get("network") or network_scores(line["layers"])
    lowest = path_norms(line["layers"][0]["iterations"])
    return {"t_score": network["t_score"], "d_score": network["d_score"], "digit_d_score": network["digit_d_score"],
            "inner_share": inner_share(line["layers"][-1]["iterations"]),
            "lowest_grad_norm": None if lowest is None else sum(lowest),
            "mode_cosine": (line.get("mode_cosine") or {}).get("all")}


def recorded_report(hidden=((4, 3),), routing="dynamic"):
    tc.manual_seed(0)
    model = CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=1, primary_dim=3, digit_dim=2,
                    num_classes=3, hidden_capsules=list(hidden), routing=routing).to(dtype="float64")
    x, y = np.random.default_rng(0).random((4, 1, 12, 12)), np.array([0, 1, 2, 0])
    return gradient_flow_report(model, x, y)


def gradflow_line(report, mode="full", cosine=0.75, logged_network=True):
    """A gradflow.jsonl line of the report's ``mode``, as train --log-gradflow writes one."""
    result = report["modes"][mode]
    line = {"epoch": 1, "batch": 2, "step": 2, "mode": mode, "layers": result["layers"],
            "network": result["network"] if logged_network else None}
    return dict(line, mode_cosine={"digit.weight": cosine, "all": cosine}) if cosine is not None else line


@pytest.mark.parametrize("hidden, routing, cosine, logged", [
    (((4, 3),), "dynamic", 0.75, True), ((), "dynamic", None, False), (((4, 3), (3, 3)), "em", 1.0, True),
    ((), "self-routing", None, True)])
def test_the_line_values_are_the_study_figures_of_before(hidden, routing, cosine, logged):
    report = recorded_report(hidden, routing)
    for mode in report["modes"]:
        line = gradflow_line(report, mode, cosine, logged)
        assert line_values(line, STUDY_FIGURES) == old_line_figures(line)


def old_format_rows(layer) -> list:
    """A layer's table rows as cli/gradflow.format_report wrote them by hand before the registry."""
    def fixed(value, digits=4):
        if value is None:
            return "-"
        text = f"{value:.{digits}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text

    def share(value):
        return "-" if value is None else (f"{value:.1e}" if 0 < value < 1e-3 else f"{value:.3f}")

    def norm(value):
        return "-" if value is None else f"{value:.3e}"

    return [f"  {row['iteration']:>2} {fixed(row['coupling_entropy']):>8} {norm(row['t_score']):>10} "
            f"{fixed(row['polarization'], 3):>7} {norm(row['d_score']):>10} {fixed(row['agreement_cosine'], 3):>7} "
            f"{norm(row['grad_norm_sum']):>10} {norm(row['grad_norm_agreement']):>10} {share(a):>9} {share(b):>9}"
            for row, (a, b) in zip(layer["iterations"], path_shares(layer["iterations"]))]


@pytest.mark.parametrize("routing", ["dynamic", "em", "self-attention"])
def test_the_table_is_the_one_written_by_hand_before(routing):
    report = recorded_report(routing=routing)
    report["config"].update(source="a test", batches=1)
    text = format_report(report).splitlines()
    assert text.count(TABLE_HEADER) == len(report["modes"]) * 2  # per mode and routing layer
    expected = [row for result in report["modes"].values() for layer in result["layers"] for row in old_format_rows(layer)]
    assert [line for line in text if line[:4].strip().isdigit()] == expected


def test_a_figure_says_what_is_wrong_with_it_and_names_are_taken_once(figures_kept):
    with pytest.raises(ValueError, match="name 'Bad name'"):
        Figure("Bad name", len, "x")
    with pytest.raises(ValueError, match="per must be one of iteration, layer, line, got 'step'"):
        Figure("x", len, "x", per="step")
    for bad in ((1.0, 0.0), 1.0, (0.0, 1.0, 2.0), (0.0, float("inf"))):
        with pytest.raises(ValueError, match=r"axis_range must be \(low, high\) with low < high"):
            Figure("x", len, "x", axis_range=bad)
    with pytest.raises(ValueError, match="compute must be callable"):
        Figure("x", None, "x")
    with pytest.raises(ValueError, match="axis_span must be one of range, from low"):
        Figure("x", len, "x", axis_span="all")
    with pytest.raises(ValueError, match="'t_score' is registered already$"):
        register_figure(Figure("t_score", len, "x"), replace=True)
    with pytest.raises(ValueError, match="'t_score' is built in"):
        unregister_figure("t_score")
    mine = register_figure(Figure("mine", len, "mine"))
    with pytest.raises(ValueError, match=r"registered already \(replace=True to replace it\)"):
        register_figure(Figure("mine", len, "other"))
    assert register_figure(Figure("mine", len, "other"), replace=True).label == "other" != mine.label
    assert (mine.column, mine.panel, mine.tag, mine.study) == (Column("mine", 10), "mine", "figure/mine", True)
    unregister_figure("mine")
    assert "mine" not in FIGURES


def test_the_old_name_of_the_study_figures_warns_and_answers():
    from tinygrad_caps.models.app.studies import registry

    with pytest.warns(DeprecationWarning, match="registry.GRADFLOW_FIGURES is deprecated and will be removed in 0.2; "
                                                r"use tinygrad_caps.models.analysis.figures.study_figure_names\(\)"):
        assert registry.GRADFLOW_FIGURES == STUDY_FIGURES


# ----- the closing note's new statistic: one entry, seen by every consumer -----

def coupling_spread(view) -> float:
    """The mean over (b, i) of max_j c - min_j c: 0 for a uniform coupling, 1 for a one-hot one."""
    c = view.coupling.numpy()
    return float((c.max(axis=-1) - c.min(axis=-1)).mean())


SPREAD = Figure("coupling_spread", coupling_spread, "coupling spread (max - min over the outputs)",
                axis_range=(0.0, 1.0), axis_label="max c - min c")


def test_a_new_statistic_is_one_entry_that_every_consumer_shows(tmp_path, figures_kept, capsys):
    register_figure(SPREAD)
    # stored per iteration, beside the built-in statistics
    trace = dynamic_trace()
    values = routing_statistics(trace)["coupling_spread"]
    assert values == [coupling_spread(statistics_module.IterationView(trace, r)) for r in range(3)] and values[0] == 0
    assert statistics_module.STATISTICS == (*ITERATION_KEYS, "coupling_spread")
    # the gradflow table's column
    report = recorded_report(hidden=())
    report["config"].update(source="a test", batches=1)
    text = format_report(report).splitlines()
    assert text.count(TABLE_HEADER + " coupling_spread") == 2
    rows = [line for line in text if line[:4].strip().isdigit()]
    spreads = [row["coupling_spread"] for result in report["modes"].values() for row in result["layers"][0]["iterations"]]
    assert [row[len(TABLE_HEADER):] for row in rows] == [f" {v:>15.3e}" for v in spreads]
    # a study reports it: trained, logged, summarised, pictured and exported
    register_study("spread", {"only": {}}, varies="nothing", epochs=1, seeds=1, options={"log_gradflow": 1},
                   figures=("t_score", "coupling_spread"))
    data = tiny_data_dir(tmp_path / "data", (16, 8), compress=False)
    out, tb = tmp_path / "study", tmp_path / "tb"
    assert cli.main(["study", "run", "spread", "--out", str(out), "--dataset", "tiny", "--data-dir", str(data), *TINY,
                     "--tensorboard-out", str(tb)]) == 0
    run = out / "runs" / "only" / "seed-0"
    lines = [json.loads(line) for line in (run / "gradflow.jsonl").read_text().splitlines()]
    assert all("coupling_spread" in row for line in lines for row in line["layers"][0]["iterations"])
    summary = json.loads((out / "summary.json").read_text())
    mean = np.mean([line_value(SPREAD, line) for line in lines])
    assert summary["figures"] == ["t_score", "coupling_spread"]
    assert summary["rows"][0]["metrics"]["coupling_spread"]["mean"] == pytest.approx(mean, rel=1e-12)
    assert "| t_score | coupling_spread |" in (out / "summary.md").read_text()
    # plot's panel, and study's summary panel
    from tinygrad_caps.models.analysis.plots import run_figure
    from tinygrad_caps.models.analysis.study_figures import study_summary_figure

    pytest.importorskip("matplotlib")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    titles = [ax.get_title() for ax in run_figure(metrics, lines).axes]
    assert titles == ["loss", "accuracy", "gradient per iteration and path", "coupling: departure from uniform (T-score)",
                      SPREAD.label]
    summary_titles = [ax.get_title() for ax in study_summary_figure(summary).axes]
    assert any(title.startswith(SPREAD.label) for title in summary_titles)
    # its TensorBoard tag
    assert ("figure/coupling_spread", line_value(SPREAD, lines[0])) in tensorboard_scalars(lines[0])
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(tb / "only" / "seed-0"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("figure/coupling_spread")] == [line["step"] for line in lines]
    assert "gradflow/digit/iteration_0/coupling_spread" in events.Tags()["scalars"]
