"""A training run's figures for TensorBoard (``train --tensorboard [DIR]``, ``plot --tensorboard-out DIR``).

Written with tensorboardX (the ``tensorboard`` extra: ``pip install -e ".[tensorboard]"``); without
it, training says so in one line and writes its JSON-lines logs as always. Tags:

    train/loss, train/accuracy, train/lr, train/images_per_second   per logging interval (each batch
                                                                    on the CPU, every 50 on a GPU)
    epoch/<metric>                                                   each number of a metrics.jsonl
                                                                     line, at the step that ended its
                                                                     epoch (a nested one as
                                                                     epoch/<key>/<key>)
    gradflow/<layer>/iteration_<r>/<statistic>                       each gradflow.jsonl line's
                                                                     per-iteration numbers
    network/t_score, network/d_score, network/digit_d_score,         the network's T and D scores of
    network/<layer>/t_score, network/<layer>/d_score                 each gradflow.jsonl line
    mode_cosine/all, mode_cosine/<parameter>                         cos(full, detach) of the step's
                                                                     gradients (--log-mode-cosine)
    figure/<name>                                                    each line's value of a figure
                                                                     registered with a tag of its own
                                                                     (analysis.figures; none built in)
    gradflow/<key>                                                   any other number of the line
                                                                     (its epoch and batch)
    coupling/<layer>/iteration_<r>                                   histograms of the couplings
    gradient/<parameter>                                             histograms of the gradients
    reconstructions                                                  test images over their
                                                                     reconstructions, at each epoch's end

``train --tensorboard`` writes them all as the run goes; ``plot --tensorboard-out`` and the study
exports write the scalars from the logs (``epoch/``, ``gradflow/``, ``network/``, ``mode_cosine/``),
the same tags and values, but have no ``train/`` interval means, histograms or reconstructions:
the logs do not keep them.

Steps are global training steps (1-based, as in gradflow.jsonl and in metrics.jsonl's "step"; a log
written before metrics lines had it is exported at its epochs). A resumed run hides the events a
checkpoint did not keep (TensorBoard's purge step), as metrics.jsonl drops them.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from tinygrad_caps.backend import to_numpy

from ...analysis.figures import numbers, tensorboard_scalars
from ...errors import UsageError
from .run_logs import read_gradflow, read_metrics
from .run_folder import RunFolder

EXPORT_SUFFIX = ".export"  # the event files of `plot`/`study --tensorboard-out`


class TensorBoardUnavailable(ImportError):
    """tensorboardX is not installed."""


class TensorBoardLog:
    """One run's event files in ``folder``; ``purge_step``: the first step a resumed run writes again."""

    def __init__(self, folder, purge_step: int | None = None, export: bool = False):
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise TensorBoardUnavailable("TensorBoard logs need tensorboardX: pip install -e \".[tensorboard]\"") from exc
        self.folder = Path(folder)
        if export:  # an export replaces the earlier exports in the folder (and nothing else)
            for old in self.folder.glob(f"events.out.tfevents.*{EXPORT_SUFFIX}"):
                old.unlink()
        # tensorboardX names an event file by the second it was opened and the host: a run resumed
        # within the same second would truncate the first file, so each file gets its own suffix.
        suffix = f".{time.time_ns()}" + (EXPORT_SUFFIX if export else "")
        self.writer = SummaryWriter(str(folder), purge_step=purge_step, filename_suffix=suffix)

    def interval(self, step: int, values: dict) -> None:
        """``train/<name>`` scalars at global ``step`` (the finite ones)."""
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                self.writer.add_scalar(f"train/{name}", value, step)

    def epoch(self, record: dict) -> None:
        """``epoch/<metric>`` for every number of one metrics.jsonl line (nested ones as
        ``epoch/<key>/<key>``), at the step that ended it."""
        step = record.get("step", record["epoch"])
        for tag, value in numbers(record, "epoch", skip=("step",)):
            self.writer.add_scalar(tag, value, step)

    def gradflow(self, record: dict, traces=(), parameters=()) -> None:
        """Every number of one gradflow.jsonl line as a scalar (``gradflow_scalars``), and (when given)
        the histograms of its step's couplings per layer and iteration (``traces``) and of the
        gradients (``parameters``: (name, Tensor))."""
        step = record["step"]
        for tag, value in gradflow_scalars(record):
            self.writer.add_scalar(tag, value, step)
        for trace in traces:
            for r, coupling in enumerate(trace.coupling):
                self.writer.add_histogram(f"coupling/{trace.name or 'digit'}/iteration_{r}", to_numpy(coupling.data), step)
        for name, parameter in parameters:
            if parameter.grad is not None:
                self.writer.add_histogram(f"gradient/{name}", to_numpy(parameter.grad.data), step)

    def reconstructions(self, step: int, images, reconstructions) -> None:
        """Images (N, C, H, W) above their reconstructions, as one picture at ``step``: images in
        [0, 1] as they are; standardised ones (smallNORB's) rescaled, each by its own minimum and
        maximum, with its reconstruction rescaled alike."""
        images, reconstructions = to_numpy(images), to_numpy(reconstructions).reshape(images.shape)
        if images.min() < 0.0 or images.max() > 1.0:
            low = images.min(axis=(1, 2, 3), keepdims=True)
            span = np.maximum(images.max(axis=(1, 2, 3), keepdims=True) - low, 1e-12)
            images, reconstructions = (images - low) / span, (reconstructions - low) / span
        top, bottom = np.concatenate(list(images), axis=-1), np.concatenate(list(reconstructions), axis=-1)
        grid = np.clip(np.concatenate([top, bottom], axis=-2), 0.0, 1.0)
        if grid.shape[0] not in (1, 3):
            grid = grid[:1]  # smallNORB's stereo pair: its first camera
        self.writer.add_image("reconstructions", grid, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def gradflow_scalars(record: dict) -> list:
    """(tag, value) for every number of one gradflow.jsonl line (``analysis.figures.tensorboard_scalars``:
    per-iteration statistics, figures with a tag of their own, the network's scores, the mode cosines,
    the line's epoch and batch); its step is the events' step."""
    return tensorboard_scalars(record)


def export_run(metrics: list, gradflow: list, folder) -> int:
    """Write a finished run's logs (metrics.jsonl and gradflow.jsonl lines, already validated) as
    TensorBoard events in ``folder``; returns how many lines were written. An export repeated into
    the same folder replaces the earlier one's event files (those named ``*.export``)."""
    log = TensorBoardLog(folder, export=True)
    try:
        for record in metrics:
            log.epoch(record)
        for record in gradflow:
            log.gradflow(record)
    finally:
        log.close()
    return len(metrics) + len(gradflow)


def export_tensorboard(run_dir, folder) -> Path:
    """Write a run's metrics.jsonl and gradflow.jsonl (each line checked) as TensorBoard event files
    in ``folder``; returns the folder. UsageError without tensorboardX."""
    run_dir = Path(run_dir)
    run = RunFolder(run_dir)
    metrics = read_metrics(run.metrics) if run.metrics.exists() else []
    gradflow = read_gradflow(run.gradflow) if run.gradflow.exists() else []
    try:
        export_run(metrics, gradflow, folder)
    except TensorBoardUnavailable as exc:
        raise UsageError(f"--tensorboard-out: {exc}") from None
    return Path(folder)
