"""The structure and types of a training checkpoint, checked as a whole when it is loaded.

A checkpoint written by ``Trainer.save`` is a dict with:

    model:     {parameter name: real floating-point array}
    optimizer: {"hyperparameters": {lr, betas, eps, weight_decay, amsgrad},
                "state": {"0": {} or {step, exp_avg, exp_avg_sq[, max_exp_avg_sq]}, "1": ..., ...}}
    scheduler: {base_lr, last_epoch, gamma} (exactly these keys)
    rng:       a NumPy PCG64 state {bit_generator, state: {state, inc}, has_uint32, uinteger}
    progress:  {epoch, step, sums: {loss, margin_loss, reconstruction_loss, correct, seen},
                best_accuracy, seconds}
    config:    the run's options and image geometry

``validate_training_checkpoint`` raises ``CheckpointError`` naming the first entry that is missing
or wrong (``progress.epoch must be an integer >= 0, got str``); it returns warnings for what is
legal but suspicious (non-finite weights).
"""
from __future__ import annotations

import math

import numpy as np

from tinygrad_caps.errors import CheckpointError

from ...capsnet.config import MODEL_CONFIGS, OptionError
from ...options import declaration
from .config import GEOMETRY_KEYS, TrainingConfig

ADAM_HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay", "amsgrad")
SCHEDULER_KEYS = ("base_lr", "last_epoch", "gamma")
SUM_KEYS = ("loss", "margin_loss", "reconstruction_loss", "correct", "seen")
PROGRESS_KEYS = ("epoch", "step", "sums", "best_accuracy", "seconds")


class _Checker:
    def __init__(self, path):
        self.path = path

    def fail(self, where, message):
        raise CheckpointError(f"{self.path}: {where} {message}")

    def dict(self, value, where, required=(), exact=False):
        if not isinstance(value, dict):
            self.fail(where, f"must be a dict, got {_kind(value)}")
        for key in required:
            if key not in value:
                self.fail(f"{where}.{key}" if where else key, "is missing")
        if exact:
            unknown = [str(k) for k in value if k not in required]
            if unknown:
                self.fail(where, f"has unknown keys {', '.join(sorted(unknown))}")
        return value

    def int(self, value, where, low=None, high=None):
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(where, f"must be an integer, got {_kind(value)}")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
            self.fail(where, f"must be an integer {bounds}, got {value}")
        return value

    def float(self, value, where, low=None, high=None, low_open=False, high_open=False):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(where, f"must be a number, got {_kind(value)}")
        if not math.isfinite(value):
            self.fail(where, f"must be finite, got {value}")
        if low is not None and (value <= low if low_open else value < low):
            self.fail(where, f"must be {'>' if low_open else '>='} {low}, got {value}")
        if high is not None and (value >= high if high_open else value > high):
            self.fail(where, f"must be {'<' if high_open else '<='} {high}, got {value}")
        return float(value)

    def bool(self, value, where):
        if not isinstance(value, bool):
            self.fail(where, f"must be true or false, got {_kind(value)}")
        return value

    def float_array(self, value, where, shape=None):
        if not isinstance(value, np.ndarray):
            self.fail(where, f"must be an array, got {_kind(value)}")
        if value.dtype.kind != "f":
            self.fail(where, f"must hold real floating-point numbers, got dtype {value.dtype}")
        if shape is not None and tuple(value.shape) != tuple(shape):
            self.fail(where, f"has shape {tuple(value.shape)}, expected {tuple(shape)}")
        return value


def _kind(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype} {tuple(value.shape)}"
    return type(value).__name__ + (f" {value!r}" if isinstance(value, (str, int, float)) and len(repr(value)) < 40 else "")


def validate_model_state(state, path, where="model") -> list:
    """Check that every entry of a model state dict is a real floating-point array; warn on non-finite values."""
    check = _Checker(path)
    check.dict(state, where)
    if not state:
        check.fail(where, "is empty")
    warnings = []
    for name, value in state.items():
        if not isinstance(name, str):
            check.fail(where, f"has a non-string key {name!r}")
        check.float_array(value, f"{where}.{name}")
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        if bad:
            warnings.append(f"{path}: {where}.{name} holds {bad} non-finite value{'s' * (bad > 1)} (NaN or Inf)")
    return warnings


def validate_config(config, path, where="config") -> dict:
    """Check the image geometry and model options a model is rebuilt from: those of the model that
    ``config["model"]`` names, each as its CapsNetConfig or BaselineCNNConfig field allows (an option
    set to null takes its default, except a number's), and the training options it records, each as
    its TrainingConfig field allows."""
    check = _Checker(path)
    check.dict(config, where, required=GEOMETRY_KEYS)
    for key in GEOMETRY_KEYS:
        check.int(config[key], f"{where}.{key}", low=1)
    kind = config.get("model")
    if kind is not None and kind not in MODEL_CONFIGS:
        check.fail(f"{where}.model", f"must be one of {', '.join(MODEL_CONFIGS)}, got {_kind(kind)}")
    config_class = MODEL_CONFIGS[kind or "capsnet"]
    for key in config_class.option_keys():
        if key not in config or (config[key] is None and config_class.field_for(key).metadata["kind"] != "int"):
            continue
        try:
            config_class.check_option(key, config[key])
        except OptionError as exc:
            check.fail(f"{where}.{key}", exc.reason)
    for field in TrainingConfig.option_fields():  # the training options it records, as their fields allow
        if field.name in config and not (field.name == "augment" and config[field.name] is None):
            try:
                declaration(field).check(config[field.name])
            except ValueError as exc:
                check.fail(f"{where}.{field.name}", str(exc))
    return config


def validate_optimizer(state, path, parameter_shapes=None, where="optimizer") -> None:
    """Check an Adam state dict: its hyperparameters and, per parameter, the step and moments' shapes."""
    check = _Checker(path)
    check.dict(state, where, required=("hyperparameters", "state"))
    hyper = check.dict(state["hyperparameters"], f"{where}.hyperparameters", required=ADAM_HYPERPARAMETERS,
                       exact=True)
    check.float(hyper["lr"], f"{where}.hyperparameters.lr", low=0.0, low_open=True)
    betas = hyper["betas"]
    if not isinstance(betas, (list, tuple)) or len(betas) != 2:
        check.fail(f"{where}.hyperparameters.betas", f"must be a pair of numbers, got {_kind(betas)}")
    for k, beta in enumerate(betas):
        check.float(beta, f"{where}.hyperparameters.betas[{k}]", low=0.0, high=1.0, high_open=True)
    check.float(hyper["eps"], f"{where}.hyperparameters.eps", low=0.0, low_open=True)
    check.float(hyper["weight_decay"], f"{where}.hyperparameters.weight_decay", low=0.0)
    check.bool(hyper["amsgrad"], f"{where}.hyperparameters.amsgrad")
    per_parameter = check.dict(state["state"], f"{where}.state")
    if parameter_shapes is not None:
        expected = [str(i) for i in range(len(parameter_shapes))]
        if sorted(per_parameter, key=str) != sorted(expected):
            check.fail(f"{where}.state", f"holds entries for {len(per_parameter)} parameters, the model has "
                                         f"{len(parameter_shapes)}")
    for key, entry in per_parameter.items():
        at = f"{where}.state.{key}"
        check.dict(entry, at)
        if not entry:
            continue
        required = ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if hyper["amsgrad"] else ())
        check.dict(entry, at, required=required, exact=True)
        check.int(entry["step"], f"{at}.step", low=1)
        shape = parameter_shapes[int(key)] if parameter_shapes is not None else None
        for name in required[1:]:
            check.float_array(entry[name], f"{at}.{name}", shape)


def validate_training_checkpoint(checkpoint, path, parameter_shapes=None) -> list:
    """Validate a whole training checkpoint (see the module docstring); returns warnings.

    ``parameter_shapes`` (the model's parameters in order) lets the optimizer's moments be checked
    against the parameters they belong to.
    """
    check = _Checker(path)
    check.dict(checkpoint, "", required=("model", "optimizer", "scheduler", "rng", "progress", "config"))
    warnings = validate_model_state(checkpoint["model"], path)
    validate_optimizer(checkpoint["optimizer"], path, parameter_shapes)

    scheduler = check.dict(checkpoint["scheduler"], "scheduler", required=SCHEDULER_KEYS, exact=True)
    check.float(scheduler["base_lr"], "scheduler.base_lr", low=0.0, low_open=True)
    check.int(scheduler["last_epoch"], "scheduler.last_epoch", low=0)
    check.float(scheduler["gamma"], "scheduler.gamma", low=0.0, low_open=True)

    rng = check.dict(checkpoint["rng"], "rng", required=("bit_generator", "state", "has_uint32", "uinteger"),
                     exact=True)
    if rng["bit_generator"] != "PCG64":
        check.fail("rng.bit_generator", f"must be 'PCG64', got {_kind(rng['bit_generator'])}")
    inner = check.dict(rng["state"], "rng.state", required=("state", "inc"), exact=True)
    check.int(inner["state"], "rng.state.state", low=0, high=2 ** 128 - 1)
    check.int(inner["inc"], "rng.state.inc", low=0, high=2 ** 128 - 1)
    check.int(rng["has_uint32"], "rng.has_uint32", low=0, high=1)
    check.int(rng["uinteger"], "rng.uinteger", low=0, high=2 ** 32 - 1)

    progress = check.dict(checkpoint["progress"], "progress", required=PROGRESS_KEYS, exact=True)
    check.int(progress["epoch"], "progress.epoch", low=0)
    check.int(progress["step"], "progress.step", low=0)
    sums = check.dict(progress["sums"], "progress.sums", required=SUM_KEYS, exact=True)
    for key in ("loss", "margin_loss", "reconstruction_loss"):
        check.float(sums[key], f"progress.sums.{key}")
    check.int(sums["seen"], "progress.sums.seen", low=0)
    check.int(sums["correct"], "progress.sums.correct", low=0, high=sums["seen"])
    check.float(progress["best_accuracy"], "progress.best_accuracy", low=-1.0, high=1.0)
    check.float(progress["seconds"], "progress.seconds", low=0.0)
    if scheduler["last_epoch"] != progress["epoch"]:
        check.fail("scheduler.last_epoch", f"is {scheduler['last_epoch']} but progress.epoch is {progress['epoch']}")

    validate_config(checkpoint["config"], path)
    return warnings
