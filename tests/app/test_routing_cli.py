"""The routing registry end to end on the tiny IDX dataset: every built-in routing and a user's own
through --routing, train, evaluate, checkpoints, gradflow (modes by what the routing takes) and
the routing-algorithms study's configurations."""
import json

import numpy as np
import pytest

import tinygrad_caps.functional as F
from helpers import write_tiny_data
from tinygrad_caps.models import (CapsNet, RoutingLayer, RoutingTrace, cli, register_routing, routing_names,
                                  unregister_routing)
from tinygrad_caps.models.app.studies.registry import get_study
from tinygrad_caps.models.capsnet.config import CapsNetConfig

SMALL = ["--kernel-size", "5", "--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "3",
         "--digit-dim", "4", "--decoder-hidden", "16,32"]


@pytest.fixture
def data_dir(tmp_path):
    return write_tiny_data(tmp_path / "data")


def gradflow(data_dir, out, *extra):
    return cli.main(["gradflow", "--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--batches", "1",
                     "--batch-size", "4", "--no-progress", *SMALL, *extra])


class LengthSoftmax(RoutingLayer):
    """A user's routing: c = softmax_j |u_hat_ij|, one step, traced like the built-in ones."""
    iterative = False

    def route_votes(self, u_hat, u, activations, trace):
        scoring = F.identity(u_hat) if trace else u_hat
        summing = F.identity(u_hat) if trace else u_hat
        scores = F.sqrt(F.sum(scoring * scoring, axis=-1) + 1e-8)
        c = F.softmax(scores, axis=2)
        s = F.routing_weighted_sum(c, summing)
        v = self.squash(s)
        record = RoutingTrace(gradient=self.gradient, dot_agreement=False) if trace else None
        if trace:
            record.record(logits=scores, coupling=c, weighted=s, outputs=v, u_hat_sum=summing, agreement=scores,
                          u_hat_agreement=scoring)
        return v, record


@pytest.fixture
def users_routing():
    register_routing("length-softmax", LengthSoftmax)
    yield "length-softmax"
    unregister_routing("length-softmax")


@pytest.mark.parametrize("routing", ["em", "self-attention", "self-routing"])
def test_train_evaluate_and_resume_with_each_new_routing(routing, data_dir, tmp_path):
    out = tmp_path / routing
    common = ["--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--no-progress", "--batch-size", "32"]
    assert cli.main(["train", *common, "--epochs", "1", "--routing", routing, "--log-gradflow", "1", *SMALL]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["routing"] == routing
    lines = [json.loads(line) for line in (out / "gradflow.jsonl").read_text().splitlines()]
    rows = lines[-1]["layers"][-1]["iterations"]
    assert len(rows) == (3 if routing == "em" else 1) and rows[0]["grad_norm_sum"] > 0
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "2", "--no-progress"]) == 0
    assert cli.main(["evaluate", "--checkpoint", str(out / "checkpoints" / "last.npz"), "--data-dir", str(data_dir),
                     "--no-progress"]) == 0
    assert cli.main(["plot", str(out), "--out", str(tmp_path / f"{routing}.png")]) == 0


def test_gradflow_takes_the_modes_the_routing_takes(data_dir, tmp_path, capsys):
    assert gradflow(data_dir, tmp_path / "em", "--routing", "em") == 0
    assert set(json.loads((tmp_path / "em" / "gradflow.json").read_text())["modes"]) == {"full", "detach"}
    assert gradflow(data_dir, tmp_path / "sa", "--routing", "self-attention") == 0
    assert list(json.loads((tmp_path / "sa" / "gradflow.json").read_text())["modes"]) == ["full"]
    capsys.readouterr()
    assert gradflow(data_dir, tmp_path / "sa2", "--routing", "self-attention", "--modes", "full,detach") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "routing 'self-attention' is not iterative" in err[0]


def test_detach_and_mode_cosine_are_refused_for_a_one_step_routing(data_dir, tmp_path, capsys):
    common = ["train", "--dataset", "tiny", "--data-dir", str(data_dir), "--epochs", "1", "--no-progress", *SMALL]
    capsys.readouterr()
    assert cli.main([*common, "--out", str(tmp_path / "a"), "--routing", "self-routing",
                     "--routing-gradient", "detach"]) == 2
    assert "not iterative" in capsys.readouterr().err
    assert cli.main([*common, "--out", str(tmp_path / "b"), "--routing", "self-routing", "--log-gradflow", "1",
                     "--log-mode-cosine"]) == 2
    assert "--log-mode-cosine: routing 'self-routing' is not iterative" in capsys.readouterr().err


def test_a_users_routing_works_through_the_config_the_cli_and_gradflow(users_routing, data_dir, tmp_path):
    assert users_routing in routing_names() and CapsNetConfig(routing=users_routing).routing == users_routing
    model = CapsNet(routing=users_routing, image_size=12, kernel_size=5, conv1_channels=4, primary_types=2,
                    num_classes=3)
    assert isinstance(model.digit, LengthSoftmax) and model.digit.gradient_modes == ("full",)
    assert gradflow(data_dir, tmp_path / "mine", "--routing", users_routing) == 0
    report = json.loads((tmp_path / "mine" / "gradflow.json").read_text())
    row = report["modes"]["full"]["layers"][0]["iterations"][0]
    assert report["config"]["model"]["routing"] == users_routing and row["grad_norm_sum"] > 0
    assert row["grad_norm_agreement"] > 0 and 0 <= row["t_score"] <= 1
    out = tmp_path / "run"
    assert cli.main(["train", "--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--epochs", "1",
                     "--no-progress", "--routing", users_routing, *SMALL]) == 0
    assert json.loads((out / "config.json").read_text())["routing"] == users_routing


def test_the_registry_refuses_taken_and_unusable_names(users_routing):
    with pytest.raises(ValueError, match="registered already"):
        register_routing(users_routing, LengthSoftmax)
    register_routing(users_routing, LengthSoftmax, replace=True)
    with pytest.raises(ValueError, match="registered already"):
        register_routing("dynamic", LengthSoftmax, replace=True)
    with pytest.raises(ValueError, match="not a usable name"):
        register_routing("has space", LengthSoftmax)
    with pytest.raises(ValueError, match="built in"):
        unregister_routing("em")
    with pytest.raises(ValueError, match="routing must be one of"):
        CapsNetConfig(routing="unregistered")


def test_the_recipe_ablation_adds_one_authors_part_at_a_time_to_the_common_recipe():
    from tinygrad_caps.models.capsnet.recipes import COMMON
    from tinygrad_caps.models.capsnet.routing import routing_recipe
    configs = get_study("recipe-ablation").configurations()
    authors = routing_recipe("em")
    varied = {"common": set(), "activations": {"input_activations"}, "init": {"capsule_init"},
              "class-loss": {"class_loss", "spread_margin_schedule"}, "lambda": {"em_inverse_temperature"}}
    assert sorted(configs) == sorted(f"em-{g}-{p}" for g in ("full", "detach") for p in (*varied, "authors"))
    for gradient in ("full", "detach"):
        for part, names in varied.items():
            config = CapsNetConfig(**configs[f"em-{gradient}-{part}"])
            assert (config.routing, config.routing_gradient, config.recipe) == ("em", gradient, "common")
            parts = config.recipe_parts().to_dict()
            differ = {name for name, value in parts.items() if value != COMMON.to_dict()[name]}
            assert differ == names and all(parts[n] == authors.to_dict()[n] for n in names), (part, parts)
        whole = CapsNetConfig(**configs[f"em-{gradient}-authors"])
        assert whole.recipe_parts() == authors and whole.routing_gradient == gradient


def test_the_routing_algorithms_study_covers_every_built_in_routing():
    configs = get_study("routing-algorithms").configurations()
    assert {options["routing"] for options in configs.values()} == set(routing_names(builtin=True))
    for options in configs.values():
        if options["routing"] in ("self-attention", "self-routing", "uniform"):
            assert "routing_gradient" not in options
    assert np.all([configs[f"{r}-{m}"]["routing_gradient"] == m for r in ("dynamic", "em") for m in ("full", "detach")])
    # each routing whose authors train it otherwise also under their recipe, the same routing and mode
    authors = {c: o for c, o in configs.items() if o.get("recipe") == "authors"}
    assert sorted(authors) == ["em-detach-authors", "em-full-authors", "self-attention-authors", "self-routing-authors"]
    for config_id, options in authors.items():
        assert {k: v for k, v in options.items() if k != "recipe"} == configs[config_id.removesuffix("-authors")]
