"""Every check a run makes before its data loads, so that a run that cannot train is refused in one
line before anything is read, built or written: the device, the model's options together and on the
dataset's geometry (a routing that refuses the gradient mode, the capsule bias or leaky routing), the
dataset (its spec, geometry and size, read without its images), the memory a CapsNet and a batch
need, ``--cuda-graph on`` where the step cannot be captured, and ``--log-mode-cosine`` where there
is no other mode or several processes.

A study checks the first run of each of its configurations with ``preflight`` before it writes
anything (``StudyPlan.check_runs``: no Trainer built, no image read); the Trainer starts with it.
"""
from __future__ import annotations

from dataclasses import dataclass

from tinygrad_caps.data import DatasetSpec, dataset_spec

from ...capsnet.routing import GRADIENT_MODES, other_mode_refusal
from ...capsnet.routing.registry import routing_refusal
from ...errors import UsageError
from .checkpoints import check_model_options
from .config import TrainingConfig
from .option_checks import device_or_usage_error
from .resources import check_fits
from .step_runner import graph_refusal


@dataclass(frozen=True)
class RunSetup:
    """What the checks found: the device (normalized), the dataset's spec and the config with the
    dataset's geometry (``TrainingConfig.for_data``)."""

    device: str
    spec: DatasetSpec
    config: TrainingConfig


def preflight(config: TrainingConfig, processes: int = 1) -> RunSetup:
    """Every check before data (the module docstring), for a run on ``processes`` processes; returns
    the RunSetup. A refusal is a UsageError (a DatasetError for a dataset that cannot be found)."""
    device = device_or_usage_error(config.device)
    check_model_options(config)  # options that do not go together, before the dataset gives the geometry
    # The registry gives the geometry and preprocessing; image_size and channels choose an image folder's.
    spec = dataset_spec(config.dataset, config.data_dir, config.image_size, config.channels)
    spec.check_available(config.data_dir)  # the DatasetError loading would raise, with nothing read yet
    config = config.for_data(spec)
    check_model_options(config)  # the same options on the dataset's geometry (an image too small for the kernels)
    if config.model == "capsnet":  # the largest batch the data can give (no more images than it holds)
        images = [n for n in (config.batch_size, config.limit_train, spec.image_count("train", config.data_dir))
                  if n is not None]
        check_fits(config.model_config.to_dict(), min(images), config.dtype)
    reason = graph_refusal(config, device, processes)
    if reason is not None and config.cuda_graph == "on":
        raise UsageError(f"--cuda-graph on: the training step cannot be captured: {reason}")
    check_mode_cosine(config, processes)
    return RunSetup(device, spec, config)


def check_mode_cosine(config: TrainingConfig, processes: int = 1) -> None:
    """UsageError where ``--log-mode-cosine`` cannot be logged: on several processes (its extra
    backward would run on rank 0 alone), or where the routing has one gradient mode only."""
    if not config.log_mode_cosine:
        return
    if processes > 1:
        raise UsageError("--log-mode-cosine needs one process: its extra backward would run on rank 0 alone")
    routing = config.model_config.routing if config.model == "capsnet" else None
    if routing is not None:
        modes = tuple(mode for mode in GRADIENT_MODES if routing_refusal(routing, mode) is None)
        refusal = other_mode_refusal(routing, modes)
        if refusal:
            raise UsageError(refusal)
