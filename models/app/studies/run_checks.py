"""The checks ``train`` makes of a run before it reads the run's data, made from its TrainingConfig
alone: a study checks the first run of every configuration so (``StudyPlan.check_runs``) before it
writes anything, without building a Trainer, reading an image or building a model.

In the order the Trainer meets them: the device; the model options that do not go together; the
dataset (its name, and its files where loading looks for them, ``DatasetSpec.check_available``);
the model options with the dataset's geometry (the routing's refusals, an image too small for the
convolutions); the memory one batch needs; ``--cuda-graph on`` where the step cannot be captured;
``--log-mode-cosine`` with a routing of one gradient mode.
"""
from __future__ import annotations

import tinygrad_caps as tc
from tinygrad_caps.data import dataset_spec

from ...capsnet.routing import GRADIENT_MODES
from ...capsnet.routing.registry import routing_refusal
from ...errors import UsageError
from ..training.checkpoints import check_model_options, model_config
from ..training.option_checks import device_or_usage_error
from ..training.resources import check_fits


def check_before_data(config) -> None:
    """Raise what the Trainer would raise for ``config`` (a TrainingConfig) before its first batch,
    as far as that is decided without the data's images: a UsageError, or a DatasetError."""
    device = device_or_usage_error(config.device)
    check_model_options(config.to_dict())
    spec = dataset_spec(config.dataset, config.data_dir, config.image_size, config.channels)
    spec.check_available(config.data_dir)
    geometry = dict(in_channels=spec.channels, image_size=spec.image_size, num_classes=spec.num_classes)
    config = config.replace(image_size=spec.image_size, network=dict(config.network, **geometry))
    options = config.to_dict()
    if config.model == "capsnet":  # (the batch the data would give: the training images may be fewer)
        check_fits(options, min(config.batch_size, config.limit_train or config.batch_size), config.dtype)
    check_model_options(options)  # the model's options on the data's geometry
    model = model_config(options)
    _check_cuda_graph(config.cuda_graph, device, model)
    if config.log_mode_cosine and config.model == "capsnet" and len(_gradient_modes(model.routing)) < 2:
        raise UsageError(f"--log-mode-cosine: routing {model.routing!r} is not iterative; it has one gradient mode, "
                         "so there is no other mode to compare with")


def _check_cuda_graph(mode: str, device: str, model) -> None:
    """UsageError where ``--cuda-graph on`` asks for a step that cannot be captured (the Trainer's reasons)."""
    if mode not in tc.cuda_graphs.MODES:
        raise UsageError(f"--cuda-graph must be one of {', '.join(tc.cuda_graphs.MODES)}, got {mode!r}")
    if mode != "on":
        return
    reason = tc.cuda_graphs.capture_unavailable_reason(device)
    if reason is None and not tc.kernels.raw_kernels_enabled():
        reason = "TINYGRAD_CAPS_RAW_KERNELS=0 sends the capsule ops to CuPy's einsum, which calls cuBLAS"
    if reason is None and model.MODEL == "cnn" and model.dropout > 0:
        reason = "the CNN's dropout draws a new mask each step (use --dropout 0 to capture)"
    if reason is None and model.MODEL == "capsnet" and model.recipe_parts().class_loss == "spread":
        reason = "the spread loss's margin changes every step, and a captured step would keep its first"
    if reason is not None:
        raise UsageError(f"--cuda-graph on: the training step cannot be captured: {reason}")


def _gradient_modes(routing: str) -> tuple:
    """The routing-gradient modes the layers of routing ``routing`` take."""
    return tuple(mode for mode in GRADIENT_MODES if routing_refusal(routing, mode) is None)
