"""One training step of a run, eager or replayed from a CUDA graph.

On a GPU the step (forward, backward, Adam, the metric sums on the device) is captured as a CUDA
graph after two eager warm-up steps and replayed for every full batch (``tinygrad_caps.cuda_graphs``);
"auto" says in one line why not where it cannot (``graph_refusal``), "on" makes that a UsageError,
the CPU ignores "auto". A captured run computes exactly what an eager one does. A batch smaller than
the others (an epoch's last) and a step that records its routing traces run eagerly. Before every
step, eager or replayed, a CapsNet learns where the run is (its loss's margin schedule reads it).
"""
from __future__ import annotations

import math

import numpy as np

import tinygrad_caps as tc

from ...capsnet.model import CapsNet
from ...errors import TrainingDiverged, UsageError
from .device_sums import DeviceSums
from .evaluation import device_losses

FLUSH_EVERY = 50  # batches between the GPU's metric reads (the progress bar's loss and accuracy)


def graph_refusal(config, device: str, processes: int = 1):
    """Why the training step of ``config`` (a TrainingConfig) on ``device`` and ``processes``
    processes will not be captured as a CUDA graph ("--cuda-graph off" for off), or None when it will."""
    if config.cuda_graph == "off":
        return "--cuda-graph off"
    reason = tc.cuda_graphs.capture_unavailable_reason(device)
    if reason is None and processes > 1:
        reason = "distributed training runs its collectives outside a graph"
    if reason is None and not tc.kernels.raw_kernels_enabled():
        reason = "TINYGRAD_CAPS_RAW_KERNELS=0 sends the capsule ops to CuPy's einsum, which calls cuBLAS"
    if reason is None and config.model == "cnn" and config.model_config.dropout > 0:
        reason = "the CNN's dropout draws a new mask each step (use --dropout 0 to capture)"
    if reason is None and config.model == "capsnet" and config.model_config.recipe_parts().class_loss == "spread":
        reason = "the spread loss's margin changes every step, and a captured step would keep its first"
    return reason


class StepRunner:
    """The training steps of ``run`` (a Trainer) on ``device``: ``step(x, y, traces)`` trains one
    host batch, ``flush(sums)`` reads the metric sums gathered on the device; ``graph_reason`` is why
    the step is not captured (None when it is)."""

    def __init__(self, run, device: str):
        self.run, self.device = run, device
        self.graph_reason = graph_refusal(run.config, device, run.shard[1])
        if self.graph_reason is not None and device != "cpu" and run.config.cuda_graph != "off":
            run.say(f"CUDA graph: off ({self.graph_reason})")
        # Metrics gather on the device; the host reads them after every batch on the CPU, every
        # FLUSH_EVERY batches on a GPU (and before every checkpoint and at the epoch's end).
        self.sums = DeviceSums(device)
        self.flush_every = 1 if device == "cpu" else FLUSH_EVERY
        self.captured = None

    def step(self, x, y, traces=None) -> None:
        """Train on one host batch: replayed from the CUDA graph when the step is captured (after its
        warm-up) and the batch is full, else eagerly (a last, smaller batch; a traced step)."""
        run = self.run
        if isinstance(run.model, CapsNet):
            run.model.set_training_position(run.global_step(), max(1, len(run.data.loader)), run.config.epochs)
        if self.graph_reason is None and traces is None and len(y) == run.config.batch_size // run.shard[1]:
            if self.captured is None:
                with tc.backend.on_device(run.model.device):
                    images = tc.zeros(x.shape, dtype=x.dtype, device=run.model.device)
                    labels = tc.zeros(y.shape, dtype=np.int64, device=run.model.device)
                self.captured = tc.cuda_graphs.CapturedStep(lambda: self.train_step(images, labels.data),
                                                            [images, labels], warmup=2)
            try:
                self.captured(x, y.astype(np.int64, copy=False))
                return
            except tc.cuda_graphs.CaptureError as exc:
                self._capture_failed(exc)  # "auto": this batch and the rest run eagerly
        with tc.backend.on_device(run.model.device):
            images = tc.tensor(x, device=run.model.device)
            self.train_step(images, tc.backend.asarray_like(y, images.data), traces)

    def train_step(self, images, labels, traces=None) -> None:
        """One optimizer step on a batch on the device (``images`` a Tensor, ``labels`` an array),
        its metrics added to the device sums; what a CUDA graph captures (with ``traces`` None)."""
        run = self.run
        loss, margin, recon, predicted = device_losses(run.model, images, labels, run.config.reconstruction_weight,
                                                       train=True, traces=traces)
        if self.flush_every == 1:  # the CPU: checked before the step reaches the weights
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise TrainingDiverged(f"the training loss became non-finite ({loss_value}) at epoch "
                                       f"{run.state['epoch'] + 1}, batch {run.state['step'] + 1}; "
                                       f"{run.checkpoints.last_good()}; try a smaller --lr")
        run.optimizer.zero_grad()
        loss.backward()
        run.parts.after_backward(run, images, labels, traces)  # (the DDP check, the mode cosine)
        run.optimizer.step()
        self.sums.add(loss, margin, recon, predicted, labels, labels.shape[0])

    def _capture_failed(self, exc) -> None:
        """A capture that failed recorded work without running it: with --cuda-graph on that is a
        UsageError; with auto the run says why in one line and goes on eagerly (the failed batch too)."""
        if self.run.config.cuda_graph == "on":
            raise UsageError(f"--cuda-graph on: {exc}") from None
        self.captured = None
        self.graph_reason = str(exc)
        self.run.say(f"CUDA graph: off ({exc}); training goes on without it")

    def flush(self, sums: dict) -> None:
        """Read the device sums into the epoch's running ``sums``; TrainingDiverged if one is not finite."""
        if not self.sums.flush(sums):
            state = self.run.state
            raise TrainingDiverged(f"the training loss became non-finite by epoch {state['epoch'] + 1}, batch "
                                   f"{state['step']}; {self.run.checkpoints.last_good()}; try a smaller --lr")
