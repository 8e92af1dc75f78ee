"""TrainingConfig is the one source of the training options: the train and study parsers, the rules of
--resume, a study's options, the presets' checks and docs/training.md's table are derived from it, and
a run's config.json (of this version or an earlier one) reads back into it."""
import dataclasses
import json

import pytest

from tinygrad_caps.models import TrainingConfig
from tinygrad_caps.models.app.cli import make_parser
from tinygrad_caps.models.app.cli.training_options import options_table_markdown
from tinygrad_caps.models.app.studies.registry import TRAINING_OPTIONS
from tinygrad_caps.models.app.training.config import (CAPSULE_TRAINING_OPTIONS, LAUNCH_OPTIONS, MAY_CHANGE_ON_RESUME,
                                                      PRESET_NAMES, STUDY_OPTIONS)
from tinygrad_caps.models.app.training.presets import PRESETS, preset_options
from tinygrad_caps.models.app.training.run_options import option_flag

from paths import ROOT


def subcommand(*names):
    parser = make_parser()
    for name in names:
        parser = next(a for a in parser._actions if a.dest in ("command", "study_command")).choices[name]
    return {action.dest: action for action in parser._actions}


def test_the_defaults_are_the_readmes_and_the_config_is_frozen():
    config = TrainingConfig()
    assert (config.dataset, config.epochs, config.batch_size, config.lr, config.lr_decay) == \
        ("fashion-mnist", 30, 100, 0.001, 0.9)
    assert (config.reconstruction_weight, config.augment, config.dtype, config.seed, config.model) == \
        (0.0005, "default", "float32", 0, "capsnet")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3
    assert config.replace(epochs=3).epochs == 3 and config.epochs == 30


@pytest.mark.parametrize("changes, field", [({"lr": 0.0}, "lr"), ({"lr": 2.0}, "lr"), ({"epochs": 0}, "epochs"),
                                            ({"epochs": True}, "epochs"), ({"augment": "tilt"}, "augment"),
                                            ({"seed": -1}, "seed"), ({"limit_train": 0}, "limit_train"),
                                            ({"device": ""}, "device"), ({"channels": 2}, "channels")])
def test_a_bad_value_is_a_value_error_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"TrainingConfig: {field} "):
        TrainingConfig().replace(**changes)


def test_a_config_json_reads_back_and_unknown_keys_are_named():
    stored = {"model": "capsnet", "dataset": "tiny", "epochs": 2, "batch_size": 8, "lr": 0.002, "augment": None,
              "seed": 5, "conv1_channels": 4, "hidden_capsules": [[3, 4]], "in_channels": 1, "image_size": 10,
              "num_classes": 3, "version": "0.1.0"}  # as an earlier version wrote it: not every option
    config = TrainingConfig.from_dict(stored)
    assert config.augment == "none" and config.network["conv1_channels"] == 4 and config.epochs == 2
    again = config.to_dict()
    assert again["augment"] is None and again["hidden_capsules"] == [[3, 4]] and again["num_classes"] == 3
    assert TrainingConfig.from_dict(json.loads(json.dumps(again))) == config
    with pytest.raises(ValueError, match="unknown option epocs"):
        TrainingConfig.from_dict(dict(stored, epocs=3))
    with pytest.raises(ValueError, match="conv1_channels"):
        TrainingConfig.from_dict(dict(stored, conv1_channels=0))
    with pytest.raises(ValueError, match="unknown option cnn_hidden"):  # a CNN option in a CapsNet run
        TrainingConfig.from_dict(dict(stored, cnn_hidden=[3, 3]))


def test_the_train_parser_has_one_option_per_field_with_its_default():
    actions = subcommand("train")
    for field in TrainingConfig.option_fields():
        action = actions[field.name]
        assert option_flag(field.name) in action.option_strings and action.default == field.default, field.name


def test_study_run_takes_the_options_a_configuration_may_set():
    actions = subcommand("study", "run")
    assert set(TRAINING_OPTIONS) == set(STUDY_OPTIONS)
    for name in STUDY_OPTIONS:
        assert name in actions or name == "model", name  # the configurations choose the model
    for field in TrainingConfig.option_fields():
        if not field.metadata["study"]:
            assert field.name not in actions, field.name


def test_the_resume_rules_come_from_the_fields():
    assert set(MAY_CHANGE_ON_RESUME) == {"epochs", "device", "data_dir", "log_gradflow", "log_mode_cosine",
                                         "cuda_graph", "tensorboard"}
    assert set(LAUNCH_OPTIONS) == {"distributed", "sync_batchnorm"}
    assert set(CAPSULE_TRAINING_OPTIONS) == {"reconstruction_weight", "log_gradflow", "log_mode_cosine"}


def test_presets_are_checked_against_the_config():
    assert tuple(PRESETS) == PRESET_NAMES
    for name in PRESETS:
        for dataset in (None, "cifar10"):
            preset_options(name, dataset)


def test_docs_training_shows_the_table_the_config_writes():
    assert options_table_markdown() in (ROOT / "docs" / "training.md").read_text()


@pytest.mark.slow
def test_a_training_config_and_a_run_folder_are_all_a_run_needs(tmp_path):
    from helpers import metrics_without_times, write_striped_dataset
    from tinygrad_caps.models.app.training import RunFolder, Trainer
    from tinygrad_caps.models.app.training.threads import default_threads

    write_striped_dataset(tmp_path / "data" / "tiny", (24, 8))
    config = TrainingConfig(dataset="tiny", data_dir=str(tmp_path / "data"), epochs=1, batch_size=8, device="cpu",
                            network={"conv1_channels": 3, "primary_types": 2, "primary_dim": 3, "digit_dim": 3,
                                     "kernel_size": 3})
    folder = RunFolder(tmp_path / "run")
    Trainer(config, folder, show_progress=False, log=lambda text: None).run()
    stored = TrainingConfig.from_dict({k: v for k, v in json.loads(folder.config.read_text()).items()})
    # what the dataset and the machine resolve: the image size, the augmentation, the thread count
    assert stored.replace(network={}) == config.replace(image_size=10, augment="shift", threads=default_threads(),
                                                        network={})
    assert stored.network["conv1_channels"] == 3 and stored.network["num_classes"] == 3
    assert [line["epoch"] for line in metrics_without_times(folder.path)] == [1] and folder.last.is_file()


def test_building_the_parser_imports_no_training_loop():
    """Each command's module owns its options, and imports the training loop only when it runs."""
    import subprocess
    import sys

    code = ("import sys; from tinygrad_caps.models.app.cli import COMMANDS, make_parser; make_parser(); "
            "print(len(COMMANDS), 'tinygrad_caps.models.app.training.trainer' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == \
        ["7", "False"]


def test_a_checkpoints_training_options_are_checked_by_their_fields():
    import tinygrad_caps as tc
    from tinygrad_caps.models.app.training.checkpoint_schema import validate_config

    geometry = dict(in_channels=1, image_size=28, num_classes=10)
    validate_config(dict(geometry, epochs=3, lr=0.01, augment=None, device="cpu"), "ckpt")
    with pytest.raises(tc.CheckpointError, match=r"config.lr must lie in \(0, 1\], got 5"):
        validate_config(dict(geometry, lr=5.0), "ckpt")
    with pytest.raises(tc.CheckpointError, match="config.batch_size must be a positive integer"):
        validate_config(dict(geometry, batch_size=0), "ckpt")
