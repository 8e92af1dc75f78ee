"""The module names this package had before it was grouped into capsnet/, analysis/ and app/.

Scripts still import them (``import tinygrad_caps.models.training``, ``from
tinygrad_caps.models.routing import dynamic_routing``). ``install`` puts a finder on
``sys.meta_path`` that answers an old name with the module now holding that code: the very same
module object, imported on first use, so attributes set through either name (a test's monkeypatch)
act on one module.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

# old name (under the package) -> where the module is now
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
    "checkpoint_schema": "app.checkpoint_schema",
    "cli_errors": "app.cli_errors",
    "distributed_training": "app.distributed_training",
    "gradflow_command": "app.commands.gradflow",
    "gradflow_log": "app.gradflow_log",
    "option_checks": "app.option_checks",
    "output_paths": "app.output_paths",
    "presets": "app.presets",
    "profile_command": "app.commands.profile",
    "progress": "app.progress",
    "resources": "app.resources",
    "run_logs": "app.run_logs",
    "run_options": "app.run_options",
    "run_state": "app.run_state",
    "training": "app.training",
    "visualize": "app.commands.visualize",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``PACKAGE.OLD`` for every OLD in MOVED and loads it as the module ``PACKAGE.MOVED[OLD]``."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        parent, _, old = fullname.rpartition(".")
        if parent != self.package or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"{self.package}.{MOVED[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__  # the import machinery sets __spec__ to the old name's; restored below
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # already executed under its own name


def install(package: str) -> None:
    """Let the old module names under ``package`` be imported (once per package).

    Call it once the package has bound its exports: an old name that is also an export (the function
    ``routing_statistics``) is registered at once and the export kept, since the import system sets
    a module as its package's attribute when it first loads it.
    """
    if any(isinstance(f, MovedModuleFinder) and f.package == package for f in sys.meta_path):
        return
    sys.meta_path.append(MovedModuleFinder(package))
    namespace = sys.modules[package].__dict__
    for old in MOVED:
        if old in namespace and not isinstance(namespace[old], types.ModuleType):
            export = namespace[old]
            importlib.import_module(f"{package}.{old}")
            namespace[old] = export
