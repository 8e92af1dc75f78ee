"""gradient_flow_report, `tinygrad-caps gradflow`, `train --log-gradflow` and `tinygrad-caps plot`,
end to end on tiny Fashion-MNIST subsets with a tiny CapsNet."""
import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet, cli, gradflow_command, gradient_flow_report
from tinygrad_caps.models.gradflow import hessian_top_eigenvalue, mean_of_reports

FASHION = Path("/usr/share/datasets/fashion-mnist")
needs_fashion = pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                                   reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
TINY_MODEL = ["--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4", "--digit-dim", "4"]
STATISTICS = {"iteration", "coupling_entropy", "t_score", "polarization", "d_score", "agreement_cosine",
              "grad_norm_sum", "grad_norm_agreement"}


def tiny_model(iterations=3, gradient="full"):
    tc.manual_seed(0)
    return CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=1, primary_dim=3, digit_dim=2,
                   num_classes=3, routing_iterations=iterations, routing_gradient=gradient).to(dtype="float64")


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
        assert set(result) == {"loss", "layers", "parameter_grad_norms", "hessian_top_eigenvalue"}
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
    from tinygrad_caps.models.losses import capsule_loss

    _, lengths, reconstruction = model(x, y)
    capsule_loss(lengths, reconstruction, x, y).backward()
    for name, p in model.named_parameters():
        assert report["modes"]["full"]["parameter_grad_norms"][name] == pytest.approx(np.linalg.norm(p.grad.numpy()), rel=1e-10)


def test_hessian_power_iteration_follows_the_exact_hessian():
    tc.manual_seed(0)
    model = CapsNet(image_size=12, kernel_size=5, conv1_channels=2, primary_types=1, primary_dim=3, digit_dim=2,
                    num_classes=2, routing_iterations=2).to(dtype="float64")
    x, y = tiny_batch(2)
    y = y % 2
    from tinygrad_caps.models.gradflow import _substituted_parameter, batch_loss

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
    lines = read_jsonl(tmp_path / "logged" / "gradflow.jsonl")
    assert [(line["epoch"], line["batch"], line["step"]) for line in lines] == [(1, 2, 2), (2, 1, 4), (2, 3, 6)]
    for line in lines:
        assert set(line) == {"epoch", "batch", "step", "mode", "layers"} and line["mode"] == "full"
        rows = line["layers"][0]["iterations"]
        assert line["layers"][0]["name"] == "digit" and [row["iteration"] for row in rows] == [0, 1, 2]
        assert all(row["grad_norm_sum"] > 0 for row in rows) and rows[0]["grad_norm_agreement"] > 0
    assert not (tmp_path / "plain" / "gradflow.jsonl").exists()

    def losses(run):
        return [(m["train_loss"], m["test_loss"]) for m in read_jsonl(tmp_path / run / "metrics.jsonl")]

    assert losses("plain") == losses("logged")
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
                   num_classes=3, hidden_capsules=[(4, 3)], capsule_bias=True).to(dtype="float64")
    report = gradient_flow_report(deep, x, y)
    for mode in ("full", "detach"):
        layers = report["modes"][mode]["layers"]
        assert [layer["name"] for layer in layers] == ["hidden.0", "digit"]
        assert all(len(layer["iterations"]) == 3 for layer in layers)
    assert report["modes"]["detach"]["layers"][0]["iterations"][0]["grad_norm_sum"] == 0.0
    assert report["modes"]["full"]["layers"][0]["iterations"][0]["grad_norm_sum"] > 0
    assert {"hidden.0.weight", "hidden.0.bias", "digit.bias"} <= set(report["mode_cosine"])
    flat = CapsNet(image_size=12, kernel_size=5, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=2,
                   num_classes=3, routing="uniform").to(dtype="float64")
    rows = gradient_flow_report(flat, x, y, modes=("full",))["modes"]["full"]["layers"][0]["iterations"]
    assert len(rows) == 1 and rows[0]["coupling_entropy"] == pytest.approx(1.0) and rows[0]["grad_norm_sum"] > 0
