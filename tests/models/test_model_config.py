"""The model's options written once: CapsNetConfig and BaselineCNNConfig (their checks, dict form and
mapping view), the CLI options, checkpoint checks, presets and README table derived from them;
CapsNetOutput; and the module names from before models/ was grouped into capsnet/, analysis/, app/."""
import copy
import dataclasses
import importlib
import re
import sys
import warnings
import json
import pickle

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import BaselineCNN, BaselineCNNConfig, CapsNet, CapsNetConfig, CapsNetOutput, cli
from tinygrad_caps.kernels.moved import MovedModuleProxy
from tinygrad_caps.models._moved import MOVED
from tinygrad_caps.models.app.training.checkpoint_schema import validate_config
from tinygrad_caps.models.app.cli.model_options import options_table_markdown
from tinygrad_caps.models.app.training.presets import PRESETS, preset_options
from tinygrad_caps.models.capsnet.config import MODEL_OPTIONS

from paths import ROOT

README = ROOT / "README.md"
SMALL = dict(image_size=12, kernel_size=3, conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4)


def test_the_readme_options_tables_are_the_configs():
    text = README.read_text()
    for config_class in (CapsNetConfig, BaselineCNNConfig):
        assert options_table_markdown(config_class) in text, f"README.md: regenerate the {config_class.__name__} table"


def test_every_field_has_a_default_allowed_values_and_help():
    for config_class in (CapsNetConfig, BaselineCNNConfig):
        for field in dataclasses.fields(config_class):
            assert field.default is not dataclasses.MISSING and field.metadata["help"], field.name
    assert MODEL_OPTIONS == ("routing_iterations", "routing_gradient", "decoder", "decoder_hidden", "conv1_channels",
                             "primary_types", "primary_dim", "digit_dim", "kernel_size", "hidden_capsules",
                             "capsule_bias", "routing", "conventions", "leaky_routing", "squash", "squash_eps",
                             "em_inverse_temperature", "capsule_init", "recipe", "input_activations", "class_loss",
                             "spread_margin_schedule", "em_cost_scale", "em_initial_assignment")


def test_dict_form_round_trips_and_bad_values_name_the_field():
    config = CapsNetConfig(hidden_capsules="3x4,2x5", capsule_bias=True)
    stored = config.to_dict()
    assert stored["hidden_capsules"] == [[3, 4], [2, 5]] and json.loads(json.dumps(stored)) == stored
    assert CapsNetConfig.from_dict(stored) == config and config.hidden_capsules == ((3, 4), (2, 5))
    for bad, field in [({"routing_iterations": 0}, "routing_iterations"), ({"routing": "agreement"}, "routing"),
                       ({"capsule_bias": 1}, "capsule_bias"), ({"hidden_capsules": [[3]]}, "hidden_capsules"),
                       ({"colour": "red"}, "colour"), ({"decoder": 3}, "decoder")]:
        with pytest.raises(ValueError, match=field):
            CapsNetConfig.from_dict(bad)
    cnn = BaselineCNNConfig(channels=[4, 4, 2], hidden=(6, 5), dropout=0.25)
    assert cnn.to_dict() == dict(model="cnn", in_channels=1, image_size=28, num_classes=10, cnn_channels=[4, 4, 2],
                                 cnn_hidden=[6, 5], dropout=0.25)
    assert BaselineCNNConfig.from_dict(cnn.to_dict()) == cnn
    with pytest.raises(ValueError, match="dropout"):
        BaselineCNNConfig(dropout=1.0)
    with pytest.raises(ValueError, match="channels"):
        BaselineCNNConfig(channels=(4, 4))
    for make in (lambda: CapsNet(colour="red"), lambda: CapsNetConfig().replace(colour="red"),
                 lambda: BaselineCNN(colour="red")):
        with pytest.raises(ValueError, match="unknown option colour"):  # a TypeError too, as Python's own
            make()


def test_models_take_a_config_or_keywords_and_read_as_before():
    tc.manual_seed(0)
    by_keywords = CapsNet(**SMALL, routing_iterations=2)
    tc.manual_seed(0)
    by_config = CapsNet.from_config(CapsNetConfig(**SMALL, routing_iterations=2))
    assert by_keywords.config == by_config.config and isinstance(by_config.config, CapsNetConfig)
    for (name, a), (_, b) in zip(by_keywords.named_parameters(), by_config.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    assert CapsNet(by_config.config.to_dict(), decoder="deconv").config.decoder == "deconv"
    config = by_keywords.config
    assert config["routing_iterations"] == 2 and config.get("conventions", "x") == "paper" and config.get("x") is None
    assert dict(config) == config.to_dict() and "decoder" in config
    cnn = BaselineCNN(image_size=6, channels=(2, 2, 2), hidden=(4, 3))
    assert cnn.config.get("model") == "cnn" and cnn.config["cnn_channels"] == [2, 2, 2]
    with pytest.raises(TypeError):
        CapsNet(**SMALL, colour="red")


def test_capsnet_output_unpacks_as_the_tuples_forward_returned():
    tc.manual_seed(0)
    model = CapsNet(**SMALL)
    x = np.random.default_rng(0).random((2, 1, 12, 12))
    out = model(x)
    assert isinstance(out, CapsNetOutput) and len(out) == 3 and out.couplings is None and out.traces is None
    v, lengths, reconstruction = out
    assert v is out.v and lengths is out.lengths and reconstruction is out.reconstruction
    traced = model(x, return_trace=True)
    assert len(traced) == 4 and traced[3] is traced.traces and traced[:3] == (traced.v, traced.lengths,
                                                                             traced.reconstruction)
    both = model(x, return_coupling=True, return_trace=True)
    v, lengths, reconstruction, couplings, traces = both
    assert couplings is both.couplings and traces is both.traces and len(couplings) == 3
    assert model(x, return_coupling=True)[3] is not None
    assert copy.copy(out).v is out.v and len(copy.copy(out)) == 3
    assert out._replace(v=None).v is None and out._asdict()["traces"] is None
    assert pickle.loads(pickle.dumps(CapsNetOutput(1, 2, 3))) == CapsNetOutput(1, 2, 3)


def test_cli_options_checkpoint_checks_and_presets_follow_the_config():
    args = vars(cli.make_parser().parse_args(["train"]))
    defaults = CapsNetConfig().to_dict()
    assert {name: args[name] for name in MODEL_OPTIONS} == {name: defaults[name] for name in MODEL_OPTIONS}
    assert (args["cnn_channels"], args["cnn_hidden"], args["dropout"]) == (None, None, None)
    geometry = dict(in_channels=1, image_size=28, num_classes=10)
    validate_config(dict(geometry, **defaults), "ckpt")
    with pytest.raises(tc.CheckpointError, match="config.routing_gradient must be one of full, detach"):
        validate_config(dict(geometry, routing_gradient="half"), "ckpt")
    with pytest.raises(tc.CheckpointError, match="config.cnn_hidden"):
        validate_config(dict(geometry, model="cnn", cnn_hidden=[1, 2, 3]), "ckpt")
    for name in PRESETS:
        for dataset in (None, "cifar10"):
            options = preset_options(name, dataset)
            CapsNetConfig.from_dict({k: v for k, v in options.items() if k in MODEL_OPTIONS})


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_paths_are_the_moved_modules_and_warn(old):
    moved = importlib.import_module(f"tinygrad_caps.models.{MOVED[old]}")
    name = f"tinygrad_caps.models.{old}"
    with warnings.catch_warnings():  # an old parent package (app.commands) warns on its own first import, which
        warnings.simplefilter("ignore", DeprecationWarning)  # an earlier test may or may not have made
        importlib.import_module(name.rpartition(".")[0])
    message = rf"{re.escape(name)} is deprecated and will be removed in 0.2; import {re.escape(moved.__name__)} instead"
    if isinstance(sys.modules.get(name), MovedModuleProxy):  # named like an export of the package
        attribute = next(n for n in vars(moved) if not n.startswith("_"))
        with pytest.warns(DeprecationWarning, match=message):
            assert getattr(importlib.import_module(name), attribute) is getattr(moved, attribute)
        return
    if sys.modules.get(name) is moved:
        del sys.modules[name]  # imported through its old path earlier in this process: import it afresh
    with pytest.warns(DeprecationWarning, match=message):
        assert importlib.import_module(name) is moved
    assert moved.__spec__.name == moved.__name__


def test_a_monkeypatch_through_an_old_path_reaches_the_moved_module(monkeypatch):
    with warnings.catch_warnings():  # (the warning itself is tested above)
        warnings.simplefilter("ignore", DeprecationWarning)
        training = importlib.import_module("tinygrad_caps.models.training")
    from tinygrad_caps.models.app.training import trainer

    monkeypatch.setattr(training, "limited", lambda images, labels, limit: "patched")
    assert trainer.limited(None, None, 1) == "patched"


def test_an_export_named_like_an_old_module_stays_the_export():
    import tinygrad_caps.models as models

    module = importlib.import_module("tinygrad_caps.models.analysis.routing_statistics")
    assert callable(models.routing_statistics) and models.routing_statistics is module.routing_statistics
