"""A model from a run's config, and a trained model back from its checkpoint.

A run's config (``config.json``, a checkpoint's ``config``) holds the run's options and the image
geometry; the model's part of it is the dict form of its CapsNetConfig or BaselineCNNConfig
(``"model"`` says which: "capsnet", the default, or "cnn"). The checkpoint's structure is checked in
``checkpoint_schema``.
"""
from __future__ import annotations

import json
from pathlib import Path

import tinygrad_caps as tc
from tinygrad_caps.data import dataset_spec
from tinygrad_caps.data.registry import OPTION_GEOMETRY

from ...capsnet.baseline_cnn import BaselineCNN
from ...capsnet.config import MODEL_CONFIGS, OptionError
from ...capsnet.model import CapsNet
from ...capsnet.routing.registry import routing_refusal
from ...errors import UsageError
from .config import GEOMETRY_KEYS
from .checkpoint_schema import validate_config, validate_model_state
from .option_checks import device_or_usage_error
from .resources import check_fits
from .run_folder import RunFolder
from .run_options import option_flag

MODELS = tuple(MODEL_CONFIGS)
MODEL_CLASSES = {"capsnet": CapsNet, "cnn": BaselineCNN}


def checkpoint_of(path, option: str = "--checkpoint"):
    """The checkpoint file ``path`` names: itself, or for a run folder its ``checkpoints/best.npz``
    (``last.npz`` where no epoch has finished). A folder with neither is a UsageError naming ``option``."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = RunFolder(path).checkpoint()
    if found is not None:
        return found
    raise UsageError(f"{option} {path}: a folder without checkpoints/best.npz or last.npz; give a run folder "
                     "(with checkpoints/) or a checkpoint file")


def model_config(config: dict):
    """The CapsNetConfig or BaselineCNNConfig (as ``config["model"]`` says) of a run's ``config``: its
    geometry and the model options it sets (an option it leaves out or sets to None takes its default)."""
    kind = config.get("model") or "capsnet"
    if kind not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {kind!r}; choose one of {MODELS}")
    config_class = MODEL_CONFIGS[kind]
    stored = {k: config[k] for k in GEOMETRY_KEYS}
    stored.update({k: config[k] for k in config_class.option_keys() if config.get(k) is not None})
    try:
        return config_class.from_dict(stored)
    except OptionError as exc:  # options that do not go together (a recipe part the routing does not take)
        raise UsageError(f"{option_flag(exc.field)} {exc.reason}") from None


def build_model(config):
    """The model a run's ``config`` describes: a ModelConfig (a TrainingConfig's ``model_config``), or
    a run's config as a dict (``config["model"]`` names it: "capsnet", the default, or "cnn", the
    paper's BaselineCNN, with the image geometry and model options beside it)."""
    settings = config if isinstance(config, tuple(MODEL_CONFIGS.values())) else model_config(config)
    _check_routing(settings)
    return MODEL_CLASSES[settings.MODEL].from_config(settings)


def check_model_options(config) -> None:
    """Raise UsageError where the model options of a run's ``config`` (a TrainingConfig, or its dict
    form) do not go together (a routing that takes no capsule bias or has no detach mode), as
    ``build_model`` would, but before the dataset gives the geometry: the model options alone are
    checked, on the default geometry where it has none yet."""
    if not isinstance(config, dict):
        _check_routing(config.model_config)
        return
    kind = config.get("model") or "capsnet"
    if kind not in MODEL_CONFIGS:
        return  # (model_config names it, where the model is built)
    defaults = MODEL_CONFIGS[kind]().to_dict()
    given = {k: v for k, v in config.items() if v is not None}  # (an unset --image-size is no geometry)
    _check_routing(model_config({**{k: defaults[k] for k in GEOMETRY_KEYS}, **given}))


def _check_routing(settings) -> None:
    """UsageError where a CapsNet's routing refuses its gradient mode, capsule bias or leaky routing."""
    if settings.MODEL == "capsnet":
        refusal = routing_refusal(settings.routing, settings.routing_gradient,
                                  settings.capsule_bias or settings.conventions == "official", settings.leaky_routing)
        if refusal:
            raise UsageError(refusal)


def load_checkpoint_model(path, overrides=None, device="auto"):
    """Rebuild the model a checkpoint was trained with (options in ``overrides`` win) and load it;
    returns ``(model, config)``. A checkpoint with non-finite weights is a CheckpointError."""
    checkpoint = tc.load(path)
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "config" not in checkpoint:
        raise tc.CheckpointError(f"{path} is not a tinygrad-caps training checkpoint (no model or config)")
    non_finite = validate_model_state(checkpoint["model"], path)
    if non_finite:  # a model with NaN weights predicts nothing meaningful: no accuracy, picture or gradient
        raise tc.CheckpointError(f"{non_finite[0]}; a model with non-finite weights cannot be used "
                                 "(the run diverged: take an earlier checkpoint)")
    validate_config(checkpoint["config"], path)
    config = dict(checkpoint["config"], **(overrides or {}))
    device = device_or_usage_error(device)
    if (config.get("model") or "capsnet") == "capsnet":
        check_fits(config, 1, next(iter(checkpoint["model"].values())).dtype, f"the model of {path}", training=False)
    model = build_model(config)
    model.to(dtype=next(iter(checkpoint["model"].values())).dtype)
    try:
        model.load_state_dict(checkpoint["model"])
    except tc.StateDictError as exc:
        conflicts = [f"--{k.replace('_', '-')} {v} (the checkpoint's is {checkpoint['config'].get(k)})"
                     for k, v in (overrides or {}).items() if checkpoint["config"].get(k) != json.loads(json.dumps(v))]
        if conflicts:  # the option, not the weights it mis-shapes, is what the user can change
            raise tc.CheckpointError(f"{', '.join(conflicts)} cannot apply to {path}: its weights have the shapes "
                                     f"of the model it was trained as; drop the option ({exc})") from exc
        raise tc.CheckpointError(f"{path}: {exc}") from exc
    model.to(device=device)
    return model, config


def checkpoint_dataset_spec(config, name, data_dir, checkpoint):
    """The DatasetSpec of dataset ``name`` for a model trained with ``config`` (a checkpoint's), checked
    against the model's input geometry and class count (UsageError naming ``checkpoint`` if they differ)."""
    # only an image folder takes the checkpoint's geometry; any other dataset has its own, which check_model compares
    geometry = (config["image_size"], config["in_channels"]) if name in OPTION_GEOMETRY else ()
    spec = dataset_spec(name, data_dir, *geometry)
    spec.check_model(config["in_channels"], config["image_size"], config["num_classes"], f"checkpoint {checkpoint}")
    return spec
