"""Checks of CLI values before any work starts: the argparse types of commands' own numbers (a
training option's is its declaration's, ``options.argument_type``), ``--out`` and ``--device``.

Each argparse type raises ``argparse.ArgumentTypeError`` with the accepted range, so a bad value
ends as argparse's one-line error and exit status 2 before anything is loaded or created.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import tinygrad_caps as tc

from ...errors import UsageError
from ...options import argument_type
from .config import TrainingConfig
from .output_paths import can_create_in
from .run_folder import RunFolder


def positive_float(text) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


seed = argument_type(TrainingConfig.field_for("seed"))
"""argparse type: a random seed in [0, 2**63 - 1] (TrainingConfig's ``seed``)."""


def check_out_folder(out, resume: bool, option: str = "--out") -> Path:
    """Raise UsageError unless ``out`` can be (or already is) a writable run folder; leaves nothing behind.

    ``option`` names the folder's option in the messages. Checks: not an existing file, every name
    within the file system's limit, and the folder (or the nearest folder above it that exists)
    writable.
    """
    out = Path(out)
    existing = out.absolute()
    while not _exists(existing):
        existing = existing.parent
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in out.absolute().parts:
        if len(os.fsencode(part)) > name_max:
            raise UsageError(f"{option}: the name {part[:40]}... is longer than the {name_max} bytes this "
                             "file system allows")
    if len(os.fsencode(str(out.absolute()))) >= path_max:
        raise UsageError(f"{option}: the path is longer than the {path_max} bytes this system allows")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {out} is an existing file, not a folder")
    if not existing.is_dir():
        raise UsageError(f"{option} {out}: {existing} is a file, so no folder can be made under it")
    if not can_create_in(existing):
        raise UsageError(f"{option} {out}: the folder {existing} is not writable")
    checkpoints = RunFolder(out).checkpoints
    if resume and out.is_dir() and not os.access(checkpoints if checkpoints.is_dir() else out, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {out}: the run folder is not writable")
    return out


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long, a loop of links: treat as absent and let the length check speak
        return False


def device_or_usage_error(device) -> str:
    """``tc.backend.normalize_device(device)``, with an unknown or unusable device reported as a UsageError."""
    try:
        return tc.backend.normalize_device(device)
    except tc.DeviceError as exc:
        raise UsageError(str(exc)) from exc


def use_command_device(device) -> None:
    """Make a command's ``--device`` GPU the process's current one (``tc.backend.use_device``), so
    that whatever CuPy allocates without naming a device lands there too; the CLI calls it once,
    before the command. An unknown or unusable device is reported as a UsageError."""
    tc.backend.use_device(device_or_usage_error(device))
