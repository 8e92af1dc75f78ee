"""gradient_flow_report, `tinygrad-caps gradflow`, `train --log-gradflow` and `tinygrad-caps plot`,
end to end on tiny Fashion-MNIST subsets with a tiny CapsNet."""
import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet, cli, gradient_flow_report
from tinygrad_caps.models.app.cli import gradflow as gradflow_command
from tinygrad_caps.models.analysis.gradflow import hessian_top_eigenvalue, mean_of_reports
from tinygrad_caps.models.analysis.routing_statistics import STATISTICS as ITERATION_STATISTICS

FASHION = Path("/usr/share/datasets/fashion-mnist")
needs_fashion = pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                                   reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
# the decoder of 16 and 32 units: with the paper's 512 and 1024 it held 99% of these models' parameters
SMALL_DECODER = (16, 32)
TINY_MODEL = ["--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4", "--digit-dim", "4",
              "--decoder-hidden", "16,32"]
TINY_OPTIONS = dict(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, decoder_hidden=SMALL_DECODER)
STATISTICS = {"iteration", *ITERATION_STATISTICS}  # every per-iteration figure (analysis/figures.py)


def tiny_model(iterations=3, gradient="full"):
    tc.manual_seed(0)
    return CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=1, primary_dim=3, digit_dim=2,
                   num_classes=3, decoder_hidden=SMALL_DECODER,
                   routing_iterations=iterations, routing_gradient=gradient).to(dtype="float64")


def tiny_batch(n=4):
    rng = np.random.default_rng(0)
    return rng.random((n, 1, 12, 12)), rng.integers(0, 3, n)


def test_report_layout_and_what_each_mode_lets_through():
    model = tiny_model(gradient="detach")
    x, y = tiny_batch()
    sentinel = tc.Tensor(np.full(model.conv1.bias.shape, 7.0))
    model.conv1.bias.grad = sentinel
    report = gradient_flow_report(model, x, y)
    assert set(report) == {"config", "modes", "mode_cosine"} and list(report["modes"]) == ["full", "detach"]
    assert model.digit.gradient == "detach" and model.conv1.bias.grad is sentinel  # restored, untouched
    names = [name for name, _ in model.named_parameters()]
    full, detach = report["modes"]["full"], report["modes"]["detach"]
    for result in (full, detach):
        assert set(result) == {"loss", "layers", "network", "parameter_grad_norms", "hessian_top_eigenvalue"}
        assert [layer["name"] for layer in result["layers"]] == ["digit"]
        rows = result["layers"][0]["iterations"]
        assert [row["iteration"] for row in rows] == [0, 1, 2] and all(set(row) == STATISTICS for row in rows)
        assert list(result["parameter_grad_norms"]) == names and result["hessian_top_eigenvalue"] is None
        assert rows[-1]["grad_norm_agreement"] is None and rows[-1]["grad_norm_sum"] > 0
    assert full["loss"] == detach["loss"]  # the mode changes the gradient, never the forward
    inner_full = full["layers"][0]["iterations"][:2]
    inner_detach = detach["layers"][0]["iterations"][:2]
    assert all(row["grad_norm_sum"] > 0 and row["grad_norm_agreement"] > 0 for row in inner_full)
    assert all(row["grad_norm_sum"] == 0.0 and row["grad_norm_agreement"] == 0.0 for row in inner_detach)
    assert list(report["mode_cosine"]) == names
    assert all(-1 - 1e-12 <= c <= 1 + 1e-12 for c in report["mode_cosine"].values())
    # the decoder sees the same forward in both modes and sits after routing: same gradient
    assert report["mode_cosine"]["decoder.fc3.weight"] == pytest.approx(1.0, abs=1e-12)
    assert report["mode_cosine"]["digit.weight"] < 1.0
    json.dumps(report)


def test_report_parameter_norms_match_a_plain_backward():
    model = tiny_model()
    x, y = tiny_batch()
    report = gradient_flow_report(model, x, y, modes=("full",))
    assert report["mode_cosine"] == {}
    from tinygrad_caps.models.capsnet.losses import capsule_loss

    _, lengths, reconstruction = model(x, y)
    capsule_loss(lengths, reconstruction, x, y).backward()
    for name, p in model.named_parameters():
        assert report["modes"]["full"]["parameter_grad_norms"][name] == pytest.approx(np.linalg.norm(p.grad.numpy()), rel=1e-10)


def test_hessian_power_iteration_follows_the_exact_hessian():
    tc.manual_seed(0)
    model = CapsNet(image_size=12, kernel_size=5, conv1_channels=2, primary_types=1, primary_dim=3, digit_dim=2,
                    num_classes=2, decoder_hidden=SMALL_DECODER, routing_iterations=2).to(dtype="float64")
    x, y = tiny_batch(2)
    y = y % 2
    from tinygrad_caps.models.analysis.gradflow import _substituted_parameter, batch_loss

    def loss_in(w):
        with _substituted_parameter(model, "digit.weight", w):
            return batch_loss(model, x, y)

    weight = model.digit.weight
    hessian = tc.hessian(loss_in, tc.Tensor(weight.numpy())).numpy().reshape(weight.size, weight.size)
    np.testing.assert_allclose(hessian, hessian.T, atol=1e-10)
    direction = np.random.default_rng(0).standard_normal(weight.size)  # the report's start, seed 0
    direction /= np.linalg.norm(direction)
    for _ in range(4):
        product = hessian @ direction
        expected = direction @ product
        direction = product / np.linalg.norm(product)
    assert hessian_top_eigenvalue(model, x, y, iterations=4) == pytest.approx(expected, rel=1e-8)
    assert model.digit.weight is weight and dict(model.named_parameters())["digit.weight"] is weight
    report = gradient_flow_report(model, x, y, modes=("full",), hessian_iterations=4)
    assert report["modes"]["full"]["hessian_top_eigenvalue"] == pytest.approx(expected, rel=1e-8)


def test_report_rejects_bad_arguments():
    model = tiny_model()
    x, y = tiny_batch()
    with pytest.raises(ValueError, match="gradient_flow_report: mode"):
        gradient_flow_report(model, x, y, modes=("full", "half"))
    with pytest.raises(ValueError, match=r"gradient_flow_report: expected images"):
        gradient_flow_report(model, x, y[:2])
    assert model.digit.gradient == "full"


def test_mean_of_reports_averages_numbers_and_keeps_names():
    a = {"name": "digit", "x": 1.0, "rows": [{"iteration": 0, "v": 2.0, "g": None}], "modes": ["full"]}
    b = {"name": "digit", "x": 3.0, "rows": [{"iteration": 0, "v": 4.0, "g": None}], "modes": ["full"]}
    assert mean_of_reports([a, b]) == {"name": "digit", "x": 2.0, "rows": [{"iteration": 0, "v": 3.0, "g": None}],
                                       "modes": ["full"]}


@needs_fashion
def test_gradflow_command_writes_json_png_and_a_table(tmp_path, capsys):
    out = tmp_path / "gf"
    status = cli.main(["gradflow", *TINY_MODEL, "--batch-size", "4", "--batches", "2", "--hessian-iterations", "1",
                       "--out", str(out)])
    assert status == 0
    report = json.loads((out / "gradflow.json").read_text())
    assert list(report["modes"]) == ["full", "detach"] and report["config"]["batches"] == 2
    assert report["modes"]["full"]["layers"][0]["name"] == "digit"
    assert isinstance(report["modes"]["detach"]["hessian_top_eigenvalue"], float)
    assert (out / "gradflow.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "mode full" in printed and "mode detach" in printed and "digit.weight" in printed


@needs_fashion
def test_gradflow_command_without_matplotlib_writes_json_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gradflow_command, "pyplot", lambda: None)
    out = tmp_path / "gf"
    assert cli.main(["gradflow", *TINY_MODEL, "--batch-size", "2", "--batches", "1", "--modes", "detach",
                     "--out", str(out)]) == 0
    assert (out / "gradflow.json").exists() and not (out / "gradflow.png").exists()
    assert "matplotlib is not installed" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--modes", "full,sideways"], "unknown mode 'sideways'"),
    (["--checkpoint", "/nonexistent/ckpt.npz"], "ckpt.npz"),
    (["--batches", "0"], "--batches"),
])
def test_gradflow_command_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) if argv[0] == "--batches" else contextlib.nullcontext() as caught:
        status = cli.main(["gradflow", *TINY_MODEL, "--out", str(tmp_path / "gf"), *argv])
    status = caught.value.code if argv[0] == "--batches" else status
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@needs_fashion
def test_train_log_gradflow_writes_its_lines_without_changing_training(tmp_path):
    common = ["train", "--epochs", "2", "--limit-train", "24", "--limit-test", "8", "--batch-size", "8",
              "--no-progress", *TINY_MODEL]
    assert cli.main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert cli.main([*common, "--out", str(tmp_path / "logged"), "--log-gradflow", "2"]) == 0
    assert cli.main([*common, "--out", str(tmp_path / "cosine"), "--log-gradflow", "2", "--log-mode-cosine"]) == 0
    lines = read_jsonl(tmp_path / "logged" / "gradflow.jsonl")
    assert [(line["epoch"], line["batch"], line["step"]) for line in lines] == [(1, 2, 2), (2, 1, 4), (2, 3, 6)]
    for line in lines:
        assert set(line) == {"epoch", "batch", "step", "mode", "layers", "network"} and line["mode"] == "full"
        rows = line["layers"][0]["iterations"]
        assert line["layers"][0]["name"] == "digit" and [row["iteration"] for row in rows] == [0, 1, 2]
        assert all(row["grad_norm_sum"] > 0 for row in rows) and rows[0]["grad_norm_agreement"] > 0
        assert line["network"]["t_score"] == rows[-1]["t_score"] and line["network"]["d_score"] is None
    assert not (tmp_path / "plain" / "gradflow.jsonl").exists()
    for line in read_jsonl(tmp_path / "cosine" / "gradflow.jsonl"):  # the other mode's gradient, same batch and weights
        cosines = line["mode_cosine"]
        assert set(cosines) == {name for name, _ in CapsNet(**TINY_OPTIONS).named_parameters()} | {"all"}
        assert 0.9 < cosines["all"] <= 1.0 + 1e-12 and cosines["digit.weight"] < 1.0

    def losses(run):
        return [(m["train_loss"], m["test_loss"]) for m in read_jsonl(tmp_path / run / "metrics.jsonl")]

    assert losses("plain") == losses("logged") == losses("cosine")
    assert cli.main(["plot", str(tmp_path / "logged"), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert cli.main(["plot", str(tmp_path / "plain")]) == 0
    assert (tmp_path / "plain" / "plot.png").exists()


def test_plot_of_a_folder_without_a_run_is_one_line_and_status_2(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "metrics.jsonl" in err and len(err.splitlines()) == 1


@needs_fashion
def test_gradflow_of_a_trained_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert cli.main(["train", "--epochs", "1", "--limit-train", "16", "--limit-test", "8", "--batch-size", "8",
                     "--no-progress", "--routing-gradient", "detach", *TINY_MODEL, "--out", str(run)]) == 0
    out = tmp_path / "gf"
    assert cli.main(["gradflow", "--checkpoint", str(run / "checkpoints" / "last.npz"), "--batch-size", "4",
                     "--batches", "1", "--modes", "full", "--out", str(out)]) == 0
    report = json.loads((out / "gradflow.json").read_text())
    assert report["config"]["source"].endswith("last.npz") and report["config"]["model"]["routing_gradient"] == "detach"
    assert report["modes"]["full"]["layers"][0]["iterations"][0]["grad_norm_sum"] > 0


def test_report_covers_every_routing_layer_of_a_deep_stack_and_uniform_routing():
    tc.manual_seed(0)
    x, y = tiny_batch(3)
    deep = CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=2,
                   num_classes=3, decoder_hidden=SMALL_DECODER,
                   hidden_capsules=[(4, 3)], capsule_bias=True).to(dtype="float64")
    report = gradient_flow_report(deep, x, y)
    for mode in ("full", "detach"):
        layers = report["modes"][mode]["layers"]
        assert [layer["name"] for layer in layers] == ["hidden.0", "digit"]
        assert all(len(layer["iterations"]) == 3 for layer in layers)
    assert report["modes"]["detach"]["layers"][0]["iterations"][0]["grad_norm_sum"] == 0.0
    assert report["modes"]["full"]["layers"][0]["iterations"][0]["grad_norm_sum"] > 0
    assert {"hidden.0.weight", "hidden.0.bias", "digit.bias"} <= set(report["mode_cosine"])
    flat = CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=2,
                   num_classes=3, decoder_hidden=SMALL_DECODER, routing="uniform").to(dtype="float64")
    rows = gradient_flow_report(flat, x, y, modes=("full",))["modes"]["full"]["layers"][0]["iterations"]
    assert len(rows) == 1 and rows[0]["coupling_entropy"] == pytest.approx(1.0) and rows[0]["grad_norm_sum"] > 0


# ----- the pictures of `gradflow` and `plot`, and `plot` on damaged logs -----
def metrics_line(epoch, loss=0.8, accuracy=0.5):
    return {"epoch": epoch, "train_loss": loss, "test_loss": loss - 0.01, "train_accuracy": accuracy,
            "test_accuracy": accuracy + 0.01, "lr": 1e-3, "seconds": 1.0}


def gradflow_line(step, iterations=3, entropy=0.9999999999, layers=("digit",)):
    rows = [{"iteration": r, "coupling_entropy": 1.0 if r == 0 else entropy - 1e-11 * step * r,
             "grad_norm_sum": 10.0 ** (-9 + 3 * r), "grad_norm_agreement": None if r == iterations - 1 else 1e-9}
            for r in range(iterations)]
    return {"epoch": 1, "batch": step, "step": step, "mode": "full",
            "layers": [{"name": name, "iterations": rows} for name in layers]}


def write_run(folder, metrics, gradflow=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if gradflow is not None:
        (folder / "gradflow.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gradflow))
    return folder


def texts_of(ax):
    return [t.get_text() for t in ax.texts]


def legend_labels(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_gradflow_picture_of_zero_gradients_says_so_on_every_gradient_panel():
    from tinygrad_caps.models.analysis.plots import gradflow_figure

    report = gradient_flow_report(tiny_model(), *tiny_batch())
    for result in report["modes"].values():
        for row in result["layers"][0]["iterations"]:
            row["grad_norm_sum"] = 0.0
            row["grad_norm_agreement"] = None if row["grad_norm_agreement"] is None else 0.0
        result["parameter_grad_norms"] = {name: 0.0 for name in result["parameter_grad_norms"]}
    report["mode_cosine"] = {name: None for name in report["mode_cosine"]}
    fig = gradflow_figure(report)
    paths, entropy, parameters, cosine = fig.axes
    assert "all gradients are zero" in texts_of(paths) and paths.get_yscale() == "linear"
    assert all(np.nanmax(np.abs(line.get_ydata())) == 0 for line in paths.lines)  # zeros drawn, not dropped
    assert "all parameter gradients are zero" in texts_of(parameters)
    assert "n/a" in texts_of(cosine) and "a gradient is zero" in cosine.get_title()
    assert entropy.get_yscale() == "log"


def test_gradflow_picture_draws_zeros_on_a_marked_floor_and_identical_curves_apart():
    from tinygrad_caps.models.analysis.plots import gradflow_figure

    report = gradient_flow_report(tiny_model(), *tiny_batch())  # detach: no gradient through r = 0, 1
    fig = gradflow_figure(report)
    paths, entropy = fig.axes[:2]
    assert paths.get_yscale() == "log"
    floor = [line for line in paths.lines if line.get_label().startswith("0 (drawn on this floor)")]
    assert len(floor) == 1
    level = floor[0].get_ydata()[0]
    detach_sum = next(line for line in paths.lines if line.get_label().startswith("detach digit sum"))
    assert list(detach_sum.get_ydata()[:2]) == [level, level]  # the two zeros, on the floor
    positive = [y for line in paths.lines if line not in floor for y in line.get_ydata() if y > level]
    assert level < min(positive)
    # the modes' forwards are the same: identical coupling curves, told apart by colour, width and legend
    full, detach = entropy.lines[:2]
    np.testing.assert_array_equal(full.get_ydata(), detach.get_ydata())
    assert full.get_color() != detach.get_color() and full.get_linewidth() > detach.get_linewidth()
    assert full.get_marker() != detach.get_marker()
    assert "detach digit (= full digit)" in legend_labels(entropy)
    assert "T-score" in entropy.get_title() and entropy.get_yscale() == "log"


def test_plot_of_a_one_epoch_run_is_readable(tmp_path):
    from tinygrad_caps.models.analysis.plots import run_figure

    fig = run_figure([metrics_line(1)], [gradflow_line(1)], "quick")
    loss, accuracy, paths, entropy = fig.axes
    fig.canvas.draw()
    for ax in (loss, accuracy):
        assert ax.get_xlim() == (0.5, 1.5) and [t for t in ax.get_xticks() if 0.5 <= t <= 1.5] == [1]
        assert all(line.get_marker() not in (None, "None", "") for line in ax.lines)
    assert "0.79" in texts_of(loss) and "0.51" in texts_of(accuracy)  # the values written beside the points
    for ax in (paths, entropy):  # one step: every series a marker (the dotted zero floor aside)
        assert all(line.get_marker() not in (None, "None", "") for line in ax.lines if "floor" not in line.get_label())
    assert fig._suptitle.get_text() == "run quick"


def test_plot_draws_one_minus_entropy_on_a_log_axis_without_an_offset(tmp_path):
    from tinygrad_caps.models.analysis.plots import run_figure

    fig = run_figure([metrics_line(1), metrics_line(2)], [gradflow_line(step) for step in (1, 2, 3)])
    entropy = fig.axes[3]
    fig.canvas.draw()
    assert entropy.get_yscale() == "log" and entropy.yaxis.get_offset_text().get_text() == ""
    assert entropy.get_ylabel().startswith("1 - coupling entropy")
    r0 = next(line for line in entropy.lines if line.get_label() == "r=0")
    floor = next(line for line in entropy.lines if line.get_label().startswith("<= 0: uniform"))
    assert set(r0.get_ydata()) == {floor.get_ydata()[0]}  # uniform coupling at r = 0: exactly 1 - 1 = 0


def test_plot_of_couplings_uniform_to_rounding_says_so():
    from tinygrad_caps.models.analysis.plots import run_figure

    lines = [gradflow_line(step) for step in (1, 2)]
    for line in lines:  # float32: 1 - entropy a little below 0 at every iteration
        for row in line["layers"][0]["iterations"]:
            row["coupling_entropy"] = 1.0 + 1e-8
    entropy = run_figure([metrics_line(1)], lines).axes[3]
    assert entropy.get_yscale() == "linear" and "every coupling is uniform" in texts_of(entropy)[0]
    assert all(set(line.get_ydata()) == {0.0} for line in entropy.lines)


def test_plot_names_the_run_and_writes_the_format_its_suffix_names(tmp_path, capsys):
    run = write_run(tmp_path / "my-run", [metrics_line(1), metrics_line(2)], [gradflow_line(1), gradflow_line(2)])
    for name, magic in (("c.png", b"\x89PNG"), ("c.pdf", b"%PDF"), ("c.SVG", b"<?xml")):
        assert cli.main(["plot", str(run), "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes()[:len(magic)] == magic
        assert capsys.readouterr().out == f"written: {tmp_path / name}\n"
    assert cli.main(["plot", str(run)]) == 0
    assert capsys.readouterr().out == f"written: {run / 'plot.png'}\n" and (run / "plot.png").exists()


@pytest.mark.parametrize("out, message", [
    ("curves.xyz", "pictures can be .png, .pdf or .svg files, not .xyz"),
    ("curves", "has no suffix; name a .png, .pdf or .svg file"),
    ("folder.png", "is a folder"),
    ("file.txt/c.png", "is a file, so no file can be made under it"),
    ("x" * 300 + ".png", "longer than"),
])
def test_plot_refuses_an_unusable_out_in_one_line(tmp_path, capsys, out, message):
    run = write_run(tmp_path / "run", [metrics_line(1)])
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "file.txt").write_text("")
    before = sorted(tmp_path.rglob("*"))
    assert cli.main(["plot", str(run), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("tinygrad-caps plot: error: --out")
    assert sorted(tmp_path.rglob("*")) == before  # nothing created


GOOD_METRICS = json.dumps(metrics_line(1)) + "\n"
GOOD_GRADFLOW = json.dumps(gradflow_line(1)) + "\n"


def _ragged():
    line = gradflow_line(2)
    line["layers"][0]["iterations"].pop()
    return json.dumps(line)


def _without_layers():
    line = gradflow_line(2)
    del line["layers"]
    return json.dumps(line)


@pytest.mark.parametrize("metrics, gradflow, message", [
    (GOOD_METRICS + "\xff\xfe{}\n", None, "metrics.jsonl: line 2 is not UTF-8 text"),
    (GOOD_METRICS + "{}\n", None, 'metrics.jsonl: line 2: has no "epoch"'),
    (GOOD_METRICS + "[1, 2]\n", None, "metrics.jsonl: line 2: the line is a list, not a JSON object"),
    (GOOD_METRICS + json.dumps(dict(metrics_line(2), test_loss="high")) + "\n", None,
     'line 2: "test_loss" is a string, not a number'),
    (GOOD_METRICS + json.dumps(dict(metrics_line(2), train_loss=float("nan"))) + "\n", None,
     "line 2: NaN is not a finite number"),
    (GOOD_METRICS + json.dumps(metrics_line(1)) + "\n", None, "epoch 1 follows epoch 1; the epochs must increase"),
    (GOOD_METRICS + json.dumps(dict(metrics_line(2), test_accuracy=7)) + "\n", None, "outside [0, 1]"),
    (GOOD_METRICS + GOOD_METRICS[:30], None, "metrics.jsonl: the last line (2) is incomplete"),
    (GOOD_METRICS, GOOD_GRADFLOW + _without_layers() + "\n", 'gradflow.jsonl: line 2: has no "layers"'),
    (GOOD_METRICS, GOOD_GRADFLOW + _ragged() + "\n", "line 2: its routing layers and iterations (digit: 2 iterations) "
                                                     "differ from the first line's (digit: 3 iterations)"),
    (GOOD_METRICS, GOOD_GRADFLOW + GOOD_GRADFLOW[:-40], "gradflow.jsonl: the last line (2) is incomplete"),
    (GOOD_METRICS, GOOD_GRADFLOW.replace('"grad_norm_sum": 1e-09', '"grad_norm_sum": -1.0', 1),
     "layers[0].iterations[0].grad_norm_sum is -1.0; a gradient norm is >= 0 or null"),
    (GOOD_METRICS, GOOD_GRADFLOW.replace('"step": 1', '"step": true'), '"step" must be a positive integer, got true'),
])
def test_plot_of_a_damaged_log_names_the_file_line_and_reason(tmp_path, capsys, metrics, gradflow, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(metrics.encode("latin-1") if "\xff" in metrics else metrics.encode())
    if gradflow is not None:
        (run / "gradflow.jsonl").write_text(gradflow)
    assert cli.main(["plot", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert str(run) in err and not (run / "plot.png").exists()


def test_plot_of_a_run_without_a_finished_epoch(tmp_path, capsys):
    run = write_run(tmp_path / "run", [])
    assert cli.main(["plot", str(run)]) == 2
    assert "holds no finished epoch yet" in capsys.readouterr().err
    write_run(run, [], [gradflow_line(1), gradflow_line(2)])  # the gradient flow of the first steps is drawn
    assert cli.main(["plot", str(run)]) == 0 and (run / "plot.png").exists()


def test_gradflow_out_must_be_a_folder(tmp_path, capsys):
    assert cli.main(["gradflow", *TINY_MODEL, "--out", str(tmp_path / "report.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "gradflow writes a folder" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "report.png").exists()


@needs_fashion
def test_gradflow_shows_a_progress_bar_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    from tinygrad_caps.models.app.training import progress

    args = ["gradflow", *TINY_MODEL, "--batch-size", "2", "--batches", "2", "--modes", "full"]
    assert cli.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "gradflow" not in capsys.readouterr().err  # not a terminal: no bar
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    assert cli.main([*args, "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "gradflow: " in err and "batch" in err
    assert cli.main([*args, "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    assert "gradflow" not in capsys.readouterr().err


# ----- every path of a one-step routing, "=" at the shown precision, D from activations, a missing run -----
def one_step_line(step, agreement=1e-4):
    """A gradflow.jsonl line of a one-step routing (self-routing's layout): one iteration with both paths."""
    row = {"iteration": 0, "coupling_entropy": 0.99, "grad_norm_sum": 1e-5, "grad_norm_agreement": agreement * step}
    return {"epoch": 1, "batch": step, "step": step, "mode": "full", "layers": [{"name": "digit", "iterations": [row]}]}


def test_plot_draws_the_agreement_path_of_a_one_step_routing():
    from tinygrad_caps.models.analysis.plots import run_figure

    paths = run_figure([metrics_line(1)], [one_step_line(step) for step in (1, 2, 3)]).axes[2]
    assert legend_labels(paths) == ["r=0 sum", "r=0 agreement"]
    agreement = next(line for line in paths.lines if line.get_label() == "r=0 agreement")
    assert list(agreement.get_ydata()) == pytest.approx([1e-4, 2e-4, 3e-4])  # the larger path, drawn
    summed = next(line for line in paths.lines if line.get_label() == "r=0 sum")
    assert agreement.get_linestyle() == "--" and summed.get_linestyle() == "-"
    assert agreement.get_markerfacecolor() == "none" != summed.get_markerfacecolor()
    # dynamic routing's last iteration has no agreement path: none is drawn for it
    labels = legend_labels(run_figure([metrics_line(1)], [gradflow_line(1)]).axes[2])
    assert not any(label.startswith("r=2 agreement") for label in labels)
    assert any(label.startswith("r=1 agreement") for label in labels)


@pytest.mark.parametrize("routing", ["self-attention", "self-routing"])
def test_gradflow_picture_tells_the_two_paths_of_a_one_step_routing_apart(routing):
    from tinygrad_caps.models.analysis.plots import gradflow_figure

    tc.manual_seed(0)
    model = CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=2,
                    num_classes=3, decoder_hidden=SMALL_DECODER, routing=routing).to(dtype="float64")
    if routing == "self-routing":  # W_route = 0 at the start: let the coupling depend on u
        model.digit.route_weight.data[...] = np.random.default_rng(0).normal(0, 0.5, model.digit.route_weight.shape)
    report = gradient_flow_report(model, *tiny_batch())
    paths = gradflow_figure(report).axes[0]
    summed, agreement = (next(line for line in paths.lines if line.get_label().startswith(f"full digit {p} path"))
                         for p in ("sum", "agreement"))
    assert len(summed.get_xdata()) == len(agreement.get_xdata()) == 1  # one point each
    assert agreement.get_ydata()[0] > 0 and summed.get_ydata()[0] > 0
    assert (agreement.get_marker(), agreement.get_markerfacecolor(), agreement.get_markersize()) != (
        summed.get_marker(), summed.get_markerfacecolor(), summed.get_markersize())
    assert agreement.get_markerfacecolor() == "none" and agreement.get_markersize() > summed.get_markersize()


def test_legend_says_equal_only_for_values_equal_as_shown():
    from tinygrad_caps.models.analysis.figure_style import coinciding_labels
    from tinygrad_caps.models.analysis.plots import run_figure

    x = [1, 2]
    assert coinciding_labels([(x, [1.0, 2.0], "a"), (x, [1.01, 2.02], "b")]) == ["a", "b"]  # 1% apart
    assert coinciding_labels([(x, [1.0, 2.0], "a"), (x, [1.00001, 2.0], "b")]) == ["a", "b (= a)"]  # 4 digits
    # one point shown is one value, not a curve: "same values", never "="
    assert coinciding_labels([(x, [0.0, None], "a"), (x, [-0.0, None], "b")]) == ["a", "b (same values as a)"]
    lines = [gradflow_line(step) for step in (1, 2)]
    for line in lines:  # r = 1's sum path 1% above r = 0's
        rows = line["layers"][0]["iterations"]
        rows[1]["grad_norm_sum"] = rows[0]["grad_norm_sum"] * 1.01
    labels = legend_labels(run_figure([metrics_line(1)], lines).axes[2])
    assert "r=1 sum" in labels and not any(label.startswith("r=1 sum (=") for label in labels)


def test_d_score_is_taken_from_the_activations_where_the_routing_has_them(tmp_path):
    from tinygrad_caps.models.app.cli.gradflow import format_report
    from tinygrad_caps.models.app.training.gradflow_log import GradflowLog
    from tinygrad_caps.models.analysis.routing_statistics import activation_d_score, routing_statistics

    x, y = tiny_batch()
    for routing, source in (("em", "activations"), ("self-routing", "activations"), ("dynamic", "lengths")):
        tc.manual_seed(0)
        model = CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=2,
                        num_classes=3, decoder_hidden=SMALL_DECODER, routing=routing).to(dtype="float64")
        outputs = model(tc.tensor(x), y, return_trace=True)
        trace = outputs.traces[-1]
        stats = routing_statistics(trace)
        for r, d in enumerate(stats["d_score"]):
            if source == "activations":
                activations = trace.activations[r].numpy()
                assert d == pytest.approx(float(activations.std(axis=0).max()), rel=1e-12)
                assert d == activation_d_score(activations)
            else:
                assert d == pytest.approx(float(np.linalg.norm(trace.outputs[r].numpy(), axis=-1).std(axis=0).max()))
        report = gradient_flow_report(model, x, y, modes=("full",))
        full = report["modes"]["full"]
        assert full["layers"][0]["d_score_from"] == source and full["network"]["digit_d_score_from"] == source
        assert f" layer digit (D from {source})" in format_report(report)
        assert f"; D from {source}" in format_report(report)
    line = GradflowLog(tmp_path / "gradflow.jsonl", 1).write(1, 1, 1, "full", [trace])  # dynamic's trace, the last
    assert line["layers"][0]["d_score_from"] == "lengths" and line["network"]["digit_d_score_from"] == "lengths"


def test_plot_of_a_folder_that_does_not_exist_says_so(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "qiuck")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(f"{tmp_path / 'qiuck'} does not exist"), err
    (tmp_path / "file").write_text("")
    assert cli.main(["plot", str(tmp_path / "file")]) == 2
    assert "is a file, not a run folder" in capsys.readouterr().err


def test_the_plot_of_a_study_run_names_its_configuration_and_study(tmp_path, monkeypatch):
    from tinygrad_caps.models.app.cli import plot as plot_command
    from tinygrad_caps.models.analysis.plots import run_figure

    study = tmp_path / "study"
    run = write_run(study / "runs" / "routing3-full" / "seed-0", [metrics_line(1)], [gradflow_line(1)])
    write_run(tmp_path / "alone" / "runs" / "x" / "seed-0", [metrics_line(1)])  # no study.json: the folder's name
    plan = {"study": "gradient-modes", "options": {}, "seeds": [0], "epochs": 1,
            "configs": [{"config_id": "routing3-full", "options": {"routing_iterations": 3},
                         "runs": [{"seed": 0, "path": "runs/routing3-full/seed-0"}]}]}
    (study / "study.json").write_text(json.dumps(plan))
    names = []
    monkeypatch.setattr(plot_command, "plot_metrics", lambda metrics, gradflow, out, name: names.append(name))
    assert cli.main(["plot", str(run)]) == 0
    assert cli.main(["plot", str(tmp_path / "alone" / "runs" / "x" / "seed-0")]) == 0
    assert names == ["seed-0: configuration routing3-full (routing_iterations=3) of study gradient-modes", "seed-0"]
    title = run_figure([metrics_line(1)], [], names[0])._suptitle.get_text()
    assert "routing3-full" in title and "gradient-modes" in title and title.startswith("run seed-0")
