"""The parts of a training run that the Trainer calls at fixed points, as Keras and Lightning call
their callbacks: the sinks (``MetricsFile``, ``ProgressBar``, ``TensorBoardSink``, ``GradflowSink``)
and any part a caller adds (``Trainer(parts=...)``).

The points, in the order a run passes them:

    on_folder_ready(run)                      the run folder and config.json exist (after the first batch)
    on_epoch_start(run)                       before the epoch's first (or, resumed, next) batch
    wants_traces(run, step) -> bool           whether the coming step (global, 1-based) records its routing
    after_backward(run, images, labels, traces)   the step's gradients exist; Adam has not moved the weights
    on_interval(run)                          the epoch's running sums were read from the device
    on_step(run, step)                        a step is counted (a ``StepDone``)
    on_gradflow(run, record, traces)          a logged step's gradflow line was written
    on_epoch_trained(run)                     the epoch's batches are done, or stopped (before the test pass)
    on_epoch_end(run, record)                 the epoch commits its metrics line ``record`` (before its checkpoint)
    close(run)                                the run ends, finished or not

``run`` is the Trainer: its ``config``, ``state``, ``model``, ``folder``, ``data``, ``checkpoints``,
``say`` and ``global_step()`` are what a part reads.
"""
from __future__ import annotations

from dataclasses import dataclass

HOOKS = ("on_folder_ready", "on_epoch_start", "after_backward", "on_interval", "on_step", "on_gradflow",
         "on_epoch_trained", "on_epoch_end", "close")


@dataclass(frozen=True)
class StepDone:
    """A counted training step: ``images`` (this process's part of the batch), its routing ``traces``
    (a list where the step recorded them, else None) and whether the sums were read after it (``flushed``)."""

    images: int
    traces: list | None = None
    flushed: bool = False


class TrainingPart:
    """A part of a run called at fixed points (as Keras/Lightning callbacks); every hook does nothing here."""

    def on_folder_ready(self, run) -> None:
        """The run folder and its config.json were just created (after the run's first batch)."""

    def on_epoch_start(self, run) -> None:
        """The epoch's batches are about to train (from ``run.state["step"]`` on)."""

    def wants_traces(self, run, step: int) -> bool:
        """Whether global step ``step`` (1-based) is to record its routing traces."""
        return False

    def after_backward(self, run, images, labels, traces) -> None:
        """A step's backward has run (``images`` a Tensor, ``labels`` an array on the device); the optimizer has not."""

    def on_interval(self, run) -> None:
        """The device's sums were added to ``run.state["sums"]``."""

    def on_step(self, run, step: StepDone) -> None:
        """A training step was applied and counted."""

    def on_gradflow(self, run, record: dict, traces) -> None:
        """A logged step's gradflow.jsonl line ``record`` was written (its ``traces`` hold the gradients)."""

    def on_epoch_trained(self, run) -> None:
        """The epoch's batches are done, or the run stopped among them."""

    def on_epoch_end(self, run, record: dict) -> None:
        """The epoch commits: ``record`` is its metrics line; the checkpoint is written after every part."""

    def close(self, run) -> None:
        """The run ends (finished, stopped or failed)."""


class Parts(list):
    """Calls a hook on every part in order (``parts.on_step(run, step)``); ``wants_traces`` is any part's."""

    def wants_traces(self, run, step: int) -> bool:
        """Whether any part wants global step ``step``'s routing traces."""
        return any(part.wants_traces(run, step) for part in self)

    def __getattr__(self, hook):
        if hook not in HOOKS:
            raise AttributeError(f"{type(self).__name__} has no hook {hook!r}")

        def call(*args) -> None:
            for part in self:
                getattr(part, hook)(*args)

        return call
