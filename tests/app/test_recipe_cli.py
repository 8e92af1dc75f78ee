"""``--recipe`` end to end on the tiny IDX dataset: ``train --recipe authors`` with every routing
learns (its loss at the final margin falls), records the recipe, logs ``--log-gradflow`` from the
routing's trace and keeps its recipe on ``--resume``; a part that does not apply to the routing, or
an unknown recipe, is one line and exit status 2."""
import json

import numpy as np
import pytest

import tinygrad_caps as tc
from helpers import write_tiny_data
from tinygrad_caps.data import dataset_spec
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.training.checkpoints import build_model, load_checkpoint_model

# kernel 3 on the 12x12 images: 16 positions x 4 types = 64 primary capsules (EM's small lambda needs a few)
SMALL = ["--kernel-size", "3", "--conv1-channels", "8", "--primary-types", "4", "--primary-dim", "4",
         "--digit-dim", "4"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_tiny_data(tmp_path_factory.mktemp("recipe") / "data")


def loss_at_the_final_margin(model, data_dir):
    """The model's loss (its recipe's, margin 0.9: a model outside a run has no position) on the 64
    training images, batch statistics."""
    spec = dataset_spec("tiny", str(data_dir))
    images, labels = spec.load("train", str(data_dir))
    x = tc.tensor(spec.preprocess(images))
    model.train()
    with tc.no_grad():
        assert model.training_position is None
        return model.loss(model(x, labels), x, labels).item()


@pytest.mark.parametrize("routing", ["dynamic", "em", "self-attention", "self-routing"])
def test_train_with_the_authors_recipe_learns_and_logs_gradflow(routing, data_dir, tmp_path, capsys):
    out = tmp_path / routing
    common = ["--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--no-progress"]
    assert cli.main(["train", *common, "--epochs", "3", "--batch-size", "16", "--lr", "0.01", "--routing", routing,
                     "--recipe", "authors", "--log-gradflow", "2", *SMALL]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["recipe"], config["class_loss"], config["squash"]) == ("authors", "recipe", "recipe")
    lines = [json.loads(line) for line in (out / "gradflow.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4, 6, 8, 10, 12]
    rows = lines[-1]["layers"][-1]["iterations"]
    assert len(rows) == (3 if routing in ("dynamic", "em") else 1) and rows[0]["grad_norm_sum"] > 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 and all(np.isfinite(m["train_loss"]) and np.isfinite(m["test_loss"]) for m in metrics)

    trained, saved = load_checkpoint_model(out / "checkpoints" / "last.npz")
    tc.manual_seed(0)  # the run's --seed: the Trainer draws its model's first weights after it
    initial = build_model(saved)
    assert trained.recipe_parts == initial.recipe_parts and trained.config.recipe == "authors"
    before, after = loss_at_the_final_margin(initial, data_dir), loss_at_the_final_margin(trained, data_dir)
    assert after < 0.95 * before, (before, after)  # 12 steps: self-routing's NLL falls the slowest (by ~9%)

    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "4", "--recipe", "common",
                     "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--recipe common differs from the run's authors" in err[0]
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "4", "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["recipe"] == "authors"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("argv, message", [
    (["--routing", "dynamic", "--em-inverse-temperature", "paper"],
     "--em-inverse-temperature schedule applies to EM routing only (--routing em), not to routing 'dynamic'"),
    (["--routing", "em", "--class-loss", "nll"], "--class-loss nll reads the log of class scores that sum to 1"),
    (["--routing", "self-attention", "--input-activations", "learned"],
     "--input-activations learned applies to routings that read input activations"),
    (["--routing", "em", "--em-inverse-temperature", "0.1,0.2"],
     "--em-inverse-temperature has 2 values for 3 routing iterations"),
    (["--recipe", "theirs"], "argument --recipe: invalid choice: 'theirs'"),
])
def test_a_part_that_does_not_apply_or_an_unknown_recipe_is_one_line_and_status_2(argv, message, data_dir,
                                                                                   tmp_path, capsys):
    for command in (["train", "--epochs", "1"], ["gradflow", "--batches", "1"]):
        capsys.readouterr()
        try:
            status = cli.main([*command, "--dataset", "tiny", "--data-dir", str(data_dir), "--out",
                               str(tmp_path / "run"), "--no-progress", *SMALL, *argv])
        except SystemExit as exc:  # argparse's refusal of a value it does not offer
            status = exc.code
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
