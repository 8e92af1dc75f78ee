"""The module paths of this package before it was grouped (capsnet/, analysis/, app/) and before the
application was split into its rooms (app/cli/, app/training/, app/studies/), and where each is now.

``install`` registers them with the one mechanism every layer uses (``tinygrad_caps.kernels.moved``):
an old path imports the module now holding its code, with a DeprecationWarning naming the new path.
They are listed in CHANGELOG.md and go in 0.2; our own code uses only the new paths.
"""
from __future__ import annotations

import tinygrad_caps.kernels.moved as moved

# old path (under the package) -> where the module is now
MOVED = {
    "baseline_cnn": "capsnet.baseline_cnn",
    "decoders": "capsnet.decoders",
    "image_batch": "capsnet.image_batch",
    "losses": "capsnet.losses",
    "routing": "capsnet.routing",
    "trace": "capsnet.trace",
    "figure_style": "analysis.figure_style",
    "gradflow": "analysis.gradflow",
    "pictures": "analysis.pictures",
    "plots": "analysis.plots",
    "routing_statistics": "analysis.routing_statistics",
    "checkpoint_schema": "app.training.checkpoint_schema",
    "cli_errors": "app.training.reporting",
    "distributed_training": "app.training.distributed",
    "gradflow_command": "app.cli.gradflow",
    "gradflow_log": "app.training.gradflow_log",
    "option_checks": "app.training.option_checks",
    "output_paths": "app.training.output_paths",
    "presets": "app.training.presets",
    "profile_command": "app.cli.profile",
    "progress": "app.training.progress",
    "resources": "app.training.resources",
    "run_logs": "app.training.run_logs",
    "run_options": "app.training.run_options",
    "run_state": "app.training.run_state",
    "training": "app.training.trainer",
    "visualize": "app.cli.visualize",
    "app.cli_errors": "app.training.reporting",
    "app.model_options": "app.cli.model_options",
    "app.commands": "app.cli",
    "app.commands.train": "app.cli.train",
    "app.commands.evaluate": "app.cli.evaluate",
    "app.commands.visualize": "app.cli.visualize",
    "app.commands.gradflow": "app.cli.gradflow",
    "app.commands.graph": "app.cli.graph",
    "app.commands.plot": "app.cli.plot",
    "app.commands.study": "app.cli.study",
    "app.commands.profile": "app.cli.profile",
    "app.checkpoints": "app.training.checkpoints",
    "app.checkpoint_schema": "app.training.checkpoint_schema",
    "app.device_sums": "app.training.device_sums",
    "app.distributed_training": "app.training.distributed",
    "app.gradflow_log": "app.training.gradflow_log",
    "app.tensorboard_log": "app.training.tensorboard_log",
    "app.option_checks": "app.training.option_checks",
    "app.output_paths": "app.training.output_paths",
    "app.presets": "app.training.presets",
    "app.progress": "app.training.progress",
    "app.resources": "app.training.resources",
    "app.run_logs": "app.training.run_logs",
    "app.run_options": "app.training.run_options",
    "app.run_state": "app.training.run_state",
    "app.study_registry": "app.studies.registry",
    "app.study_runner": "app.studies.runner",
    "app.study_summary": "app.studies.summary",
    "capsnet.routing_algorithms": "capsnet.routing",
    "capsnet.routing_layers": "capsnet.routing",
}


def install(package: str) -> None:
    """Let the old module paths under ``package`` be imported, with a DeprecationWarning."""
    moved.install(package, MOVED)
