"""``train --tensorboard`` and ``plot --tensorboard-out``: the event files, read back with
TensorBoard's own EventAccumulator, hold the tags, steps and values of metrics.jsonl and
gradflow.jsonl; a resumed run does not repeat steps; without tensorboardX a run says so in one
line and writes its JSON-lines logs as always."""
import json
import sys

import pytest

from tinygrad_caps.models import cli

import cli_helpers
from cli_helpers import TINY_DIM3_CPU, tiny_data_dir

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


@pytest.fixture
def data_dir(tmp_path):
    """24 training images: 3 batches an epoch."""
    return tiny_data_dir(tmp_path / "data", (24, 8))


def train(data_dir, out, *extra):
    return cli_helpers.train(data_dir, out, *extra, options=TINY_DIM3_CPU)


def events(folder):
    accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0,
                                                                                 "images": 0})
    accumulator.Reload()
    return accumulator


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_training_writes_what_the_logs_hold(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train(data_dir, out, "--epochs", "2", "--log-gradflow", "2", "--tensorboard") == 0
    read = events(out / "tensorboard")
    metrics, gradflow = lines(out / "metrics.jsonl"), lines(out / "gradflow.jsonl")
    for key in ("train_loss", "test_accuracy", "lr", "epoch"):
        scalars = read.Scalars(f"epoch/{key}")
        assert [e.step for e in scalars] == [m["step"] for m in metrics] == [3, 6]  # 3 batches an epoch
        assert [e.value for e in scalars] == pytest.approx([m[key] for m in metrics], rel=1e-6)
    assert [e.step for e in read.Scalars("train/loss")] == list(range(1, 7))  # each batch on the CPU
    steps = [record["step"] for record in gradflow]
    for iteration in range(3):
        tag = f"gradflow/digit/iteration_{iteration}/coupling_entropy"
        assert [e.step for e in read.Scalars(tag)] == steps
        assert [e.value for e in read.Scalars(tag)] == pytest.approx(
            [r["layers"][0]["iterations"][iteration]["coupling_entropy"] for r in gradflow], rel=1e-6)
    tags = read.Tags()
    assert {"coupling/digit/iteration_0", "gradient/digit.weight"} <= set(tags["histograms"])
    assert [e.step for e in read.Images("reconstructions")] == [3, 6]


def test_a_resumed_run_does_not_repeat_steps(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train(data_dir, out, "--epochs", "1", "--tensorboard") == 0
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "2", "--no-progress"]) == 0
    read = events(out / "tensorboard")
    assert [e.step for e in read.Scalars("epoch/test_loss")] == [3, 6]
    assert [e.step for e in read.Scalars("train/loss")] == list(range(1, 7))


def test_a_run_resumed_within_the_same_second_keeps_the_first_file(data_dir, tmp_path, monkeypatch):
    """tensorboardX names event files by the second and the host; a resume in the same second must
    not truncate the file the first run wrote."""
    import time as time_module
    frozen = time_module.time()
    monkeypatch.setattr(time_module, "time", lambda: frozen)
    out = tmp_path / "run"
    assert train(data_dir, out, "--epochs", "1", "--tensorboard") == 0
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "2", "--no-progress"]) == 0
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert [e.step for e in events(out / "tensorboard").Scalars("epoch/test_loss")] == [3, 6]


def test_plot_exports_a_finished_run(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(data_dir, out, "--epochs", "2", "--log-gradflow", "3") == 0
    assert not (out / "tensorboard").exists()
    capsys.readouterr()
    assert cli.main(["plot", str(out), "--tensorboard-out", str(tmp_path / "tb")]) == 0
    assert "(TensorBoard)" in capsys.readouterr().out
    read = events(tmp_path / "tb")
    assert [e.value for e in read.Scalars("epoch/train_accuracy")] == pytest.approx(
        [m["train_accuracy"] for m in lines(out / "metrics.jsonl")], rel=1e-6)
    assert [e.step for e in read.Scalars("gradflow/digit/iteration_2/grad_norm_sum")] == [
        r["step"] for r in lines(out / "gradflow.jsonl")]


def test_without_tensorboardx_training_says_so_once_and_goes_on(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # an import of it fails, as when it is not installed
    out = tmp_path / "run"
    assert train(data_dir, out, "--epochs", "1", "--tensorboard") == 0
    printed = capsys.readouterr().out
    assert printed.count("tensorboard: not written") == 1 and "tensorboardX" in printed
    assert lines(out / "metrics.jsonl") and not (out / "tensorboard").exists()
    assert cli.main(["plot", str(out), "--tensorboard-out", str(tmp_path / "tb")]) == 2
    assert "tensorboardX" in capsys.readouterr().err


def test_a_study_exports_one_tensorboard_run_per_configuration_and_seed(data_dir, tmp_path, capsys):
    study = tmp_path / "study"
    tb = tmp_path / "tb"
    assert cli.main(["study", "run", "conventions", "--out", str(study), "--dataset", "tiny", "--data-dir",
                     str(data_dir), *TINY_DIM3_CPU, "--seeds", "2", "--epochs", "1", "--tensorboard-out", str(tb)]) == 0
    assert "(TensorBoard, 8 runs)" in capsys.readouterr().out
    plan = json.loads((study / "study.json").read_text())
    for config in plan["configs"]:
        for run in config["runs"]:
            metrics = lines(study / run["path"] / "metrics.jsonl")
            read = events(tb / config["config_id"] / f"seed-{run['seed']}")
            assert [e.value for e in read.Scalars("epoch/test_accuracy")] == pytest.approx(
                [m["test_accuracy"] for m in metrics], rel=1e-6)
    # exporting again (study summary) replaces the earlier export instead of adding to it
    first = plan["configs"][0]
    assert cli.main(["study", "summary", str(study), "--tensorboard-out", str(tb)]) == 0
    read = events(tb / first["config_id"] / "seed-0")
    assert [e.step for e in read.Scalars("epoch/test_accuracy")] == [
        m["step"] for m in lines(study / first["runs"][0]["path"] / "metrics.jsonl")]
    assert cli.main(["study", "summary", str(tmp_path / "nowhere"), "--tensorboard-out", str(tb)]) == 2
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    assert cli.main(["study", "summary", str(study), "--tensorboard-out", str(tmp_path / "afile")]) == 2
    assert "--tensorboard-out" in capsys.readouterr().err


def leaves(record, prefix=""):
    """Every number of a JSON line, as (path, value), the lists of layers and iterations by name and index."""
    if isinstance(record, dict):
        for key, value in record.items():
            yield from leaves(value, f"{prefix}/{key}")
    elif isinstance(record, list):
        for k, value in enumerate(record):
            yield from leaves(value, f"{prefix}[{k}]")
    elif isinstance(record, (int, float)) and not isinstance(record, bool):
        yield prefix, record


def test_the_scalars_of_a_gradflow_line_are_every_number_it_holds():
    from tinygrad_caps.models.app.training.tensorboard_log import gradflow_scalars

    rows = [{"iteration": 0, "t_score": 0.1, "d_score": 0.2, "grad_norm_sum": 1.0, "grad_norm_agreement": 0.5},
            {"iteration": 1, "t_score": 0.3, "d_score": 0.4, "grad_norm_sum": 2.0, "grad_norm_agreement": None}]
    record = {"epoch": 2, "batch": 3, "step": 7, "mode": "full", "d_note": "text",
              "layers": [{"name": "digit", "d_score_from": "activations", "iterations": rows}],
              "network": {"t_score": 0.3, "d_score": None, "digit_d_score": 0.4, "digit_d_score_from": "activations",
                          "layers": {"digit": {"t_score": 0.3, "d_score": 0.4}}},
              "mode_cosine": {"digit.weight": 0.9, "conv1.bias": None, "all": 0.95}}
    scalars = dict(gradflow_scalars(record))
    assert scalars == {"gradflow/digit/iteration_0/t_score": 0.1, "gradflow/digit/iteration_0/d_score": 0.2,
                       "gradflow/digit/iteration_0/grad_norm_sum": 1.0,
                       "gradflow/digit/iteration_0/grad_norm_agreement": 0.5,
                       "gradflow/digit/iteration_1/t_score": 0.3, "gradflow/digit/iteration_1/d_score": 0.4,
                       "gradflow/digit/iteration_1/grad_norm_sum": 2.0,
                       "network/t_score": 0.3, "network/digit_d_score": 0.4, "network/digit/t_score": 0.3,
                       "network/digit/d_score": 0.4, "mode_cosine/digit.weight": 0.9, "mode_cosine/all": 0.95,
                       "gradflow/epoch": 2, "gradflow/batch": 3}
    # every number of the line is there (the step is the events' step, None and text are no scalars)
    numbers = [value for path, value in leaves(record) if path not in ("/step",) and not path.endswith("/iteration")]
    assert sorted(numbers) == sorted(scalars.values())


def test_a_live_run_and_its_export_hold_the_same_scalars_but_the_interval_means(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(data_dir, out, "--epochs", "2", "--log-gradflow", "2", "--log-mode-cosine", "--tensorboard") == 0
    assert cli.main(["plot", str(out), "--tensorboard-out", str(tmp_path / "tb")]) == 0
    live, export = events(out / "tensorboard"), events(tmp_path / "tb")
    live_tags, export_tags = set(live.Tags()["scalars"]), set(export.Tags()["scalars"])
    assert export_tags == {tag for tag in live_tags if not tag.startswith("train/")}
    gradflow = lines(out / "gradflow.jsonl")
    steps = [record["step"] for record in gradflow]
    for tag, key in (("network/t_score", ("network", "t_score")), ("network/digit_d_score", ("network", "digit_d_score")),
                     ("mode_cosine/all", ("mode_cosine", "all")), ("network/digit/t_score", None)):
        for read in (live, export):
            assert [e.step for e in read.Scalars(tag)] == steps
            if key is not None:
                assert [e.value for e in read.Scalars(tag)] == pytest.approx(
                    [record[key[0]][key[1]] for record in gradflow], rel=1e-6)
    assert "mode_cosine/digit.weight" in export_tags and "gradflow/batch" in export_tags
    metrics = lines(out / "metrics.jsonl")
    for key in ("train_margin_loss", "test_reconstruction_loss", "seconds"):
        assert [e.value for e in export.Scalars(f"epoch/{key}")] == pytest.approx([m[key] for m in metrics], rel=1e-6)
    assert set(live.Tags()["histograms"]) and not export.Tags()["histograms"] and not export.Tags()["images"]
