"""``train --tensorboard [DIR]`` as a part of a run: TensorBoard event files (``tensorboard_log``,
whose docstring lists the tags) written as the run goes, once its folder exists.

At every read of the metric sums, the interval's ``train/`` means (loss, accuracy, rate, images/s);
at every logged gradflow step, the line's scalars and the histograms of its couplings and gradients;
at every epoch's end, before the metrics line and the checkpoint, its ``epoch/`` metrics and, for a
CapsNet, 8 test images over their reconstructions. A resumed run purges the events past its
checkpoint; without tensorboardX the run says so once and goes on with its JSON-lines logs.
"""
from __future__ import annotations

import time

import tinygrad_caps as tc

from ...capsnet.model import CapsNet
from .callbacks import TrainingPart
from .tensorboard_log import TensorBoardLog, TensorBoardUnavailable


class TensorBoardSink(TrainingPart):
    """--tensorboard: interval, gradflow, epoch and reconstruction events in ``folder`` (None: the run
    folder's tensorboard/); ``writer``: the event writer's class (``TensorBoardLog``; a test's recorder)."""

    def __init__(self, folder=None, writer=TensorBoardLog):
        self.folder, self.writer_class = folder, writer
        self.log, self.wanted = None, True
        self.interval_start = None  # (the sums, time.perf_counter()) where the current interval began

    def writer(self, run):
        """The run's event writer once its folder exists, else None; a missing tensorboardX is said
        once, and the run goes on without events."""
        if not self.wanted or not run.folder_ready:
            return None
        if self.log is None:
            checkpoints = run.checkpoints
            try:
                # a fresh start purges from step 0: events of an earlier attempt that left no checkpoint
                self.log = self.writer_class(self.folder or run.folder.tensorboard,
                                             purge_step=checkpoints.resumed_step + 1 if checkpoints.resuming else 0)
            except TensorBoardUnavailable as exc:
                run.say(f"tensorboard: not written ({exc}); metrics.jsonl and gradflow.jsonl are")
                self.wanted = False
                return None
        return self.log

    def on_epoch_start(self, run) -> None:
        self.interval_start = (dict(run.state["sums"]), time.perf_counter())

    def on_interval(self, run) -> None:
        """The means of the interval since the last read: ``train/`` loss, accuracy, rate, images/s."""
        sums = run.state["sums"]
        start, self.interval_start = self.interval_start, (dict(sums), time.perf_counter())
        seen = sums["seen"] - start[0]["seen"]
        log = self.writer(run)
        if log is not None and seen > 0:
            elapsed = time.perf_counter() - start[1]
            log.interval(run.global_step(), {
                "loss": (sums["loss"] - start[0]["loss"]) / seen,
                "accuracy": (sums["correct"] - start[0]["correct"]) / seen, "lr": float(run.optimizer.lr),
                "images_per_second": seen * run.shard[1] / elapsed if elapsed > 0 else None})

    def on_gradflow(self, run, record: dict, traces) -> None:
        log = self.writer(run)
        if log is not None:
            log.gradflow(record, traces, run.model.named_parameters())

    def on_epoch_end(self, run, record: dict) -> None:
        """The epoch's metrics line and, for a CapsNet, 8 test images over their reconstructions.
        Written before the metrics line: events past the checkpoint a crash leaves are purged on
        resume, while an epoch written after its checkpoint would be lost by a crash in between."""
        log = self.writer(run)
        if log is None:
            return
        log.epoch(record)
        if isinstance(run.model, CapsNet):
            images = run.data.spec.preprocess(run.data.test_images[:8])  # as evaluated: no augmentation
            with tc.no_grad(), tc.backend.on_device(run.model.device):
                run.model.eval()
                outputs = run.model(tc.tensor(images, device=run.model.device))
            log.reconstructions(record["step"], images, outputs.reconstruction.data)
        log.flush()

    def close(self, run) -> None:
        if self.log is not None:
            self.log.close()
