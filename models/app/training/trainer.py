"""Training and evaluation of CapsNet: the loop, metrics, writing checkpoints and resume (a model is
rebuilt from a checkpoint in ``checkpoints``).

A checkpoint holds the model, the optimizer, the scheduler, the engine's RNG state, the epoch, the
number of batches already done in that epoch and the running sums of its metrics, so a resumed run
(after Ctrl-C too) produces the same metrics as one that was never interrupted: shuffling and
augmentation are drawn per (seed, epoch, batch), never from a stream that a restart would reset.

Crash consistency (see ``run_state``): the checkpoint is the single source of truth. A batch (its
forward, backward, optimizer step and counters) and an epoch's commit (its metrics line, the
schedule step, ``best.npz`` and ``last.npz``) are critical sections that a second Ctrl-C or SIGTERM
cannot cut. The metrics line is appended and fsynced before ``last.npz`` is written; on resume, the
lines beyond the checkpoint's epoch are dropped (the file is rewritten atomically), so no epoch can
appear twice. SIGTERM is handled like Ctrl-C (stop after the batch, save, exit 143). A run whose loss
or weights become non-finite stops with ``TrainingDiverged`` and keeps the last good checkpoint.
The run folder is created only once the first batch has trained.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.data import BatchIterator, dataset_spec, find_dataset_dir

from ...capsnet.baseline_cnn import BaselineCNN
from ...capsnet.config import MODEL_OPTIONS, OptionError
from ...capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT
from ...analysis.gradflow import mode_gradient_cosines, supported_modes
from ...capsnet.model import CapsNet
from ...errors import TrainingDiverged, UsageError
from .checkpoint_schema import validate_optimizer, validate_training_checkpoint
from .checkpoints import build_model, check_model_options
from .config import TrainingConfig
from .device_sums import DeviceSums
from .gradflow_log import GradflowLog, keep_gradflow_through_step
from .option_checks import device_or_usage_error
from .progress import progress_bar as _progress
from .reporting import plural
from .resources import check_fits
from .run_folder import RunFolder
from .run_options import option_flag
from .run_state import (Interrupted, StopSignals, TimeLimitReached, append_metrics_line, crash_point,
                        keep_metrics_through_epoch, remove_stale_temporaries, write_text_atomically)
from .tensorboard_log import TensorBoardLog, TensorBoardUnavailable
from .threads import default_threads, run_threads


def batch_losses(model, x, y, reconstruction_weight, train: bool, traces=None):
    """(mean loss, per-example margin and reconstruction losses, predicted classes) for one batch.

    With a list as ``traces``, a CapsNet's forward also records its routing traces, set to record
    the gradient norm of every path in the coming backward, and appends them to that list.

    The decoder is masked by the labels when ``train``, by the prediction otherwise; the loss is the
    model's (``CapsNet.loss``: its recipe's class loss, the margin loss in its ``conventions`` under
    the common recipe), and the "margin" entries hold that class loss. For a BaselineCNN they hold
    the per-example cross-entropy and the reconstruction entries are zero.
    """
    with tc.backend.on_device(model.device):  # labels and predictions beside the model, whichever GPU is current
        return _batch_losses(model, x, y, reconstruction_weight, train, traces)


def _batch_losses(model, x, y, reconstruction_weight, train, traces):
    images = tc.tensor(x, device=model.device)  # one upload per batch, used by the model and the loss
    labels = tc.backend.asarray_like(y, images.data)  # the same for the labels (the mask and the margin loss)
    loss, margin, recon, predicted = device_losses(model, images, labels, reconstruction_weight, train, traces)
    return loss, margin, recon, tc.backend.to_numpy(predicted)


def device_losses(model, images, labels, reconstruction_weight, train: bool, traces=None):
    """``batch_losses`` on a batch already on the model's device (``images`` a Tensor, ``labels`` an
    array beside it), with the predicted classes left there too: nothing is read by the host, so a
    CUDA graph can capture it."""
    if isinstance(model, BaselineCNN):
        logits = model(images)
        cross_entropy = tc.functional.cross_entropy(logits, labels, reduction="none")
        return tc.functional.mean(cross_entropy), cross_entropy, cross_entropy * 0.0, logits.data.argmax(axis=1)
    outputs = model(images, labels if train else None, return_trace=traces is not None)
    if traces is not None:
        traces.extend(trace.track_grad_norms() for trace in outputs.traces)
    loss, margin, recon = model.loss(outputs, images, labels, reconstruction_weight, return_terms=True)
    return loss, margin, recon, outputs.lengths.data.argmax(axis=1)


def evaluate(model, images, labels, batch_size, num_classes, reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT,
             progress=None, preprocess=None, shard=(0, 1), check_stop=None):
    """Accuracy, mean losses and the confusion matrix (rows: true class) on a dataset, no augmentation.

    ``preprocess`` turns the stored uint8 images into the model's input (a dataset's
    ``test_preprocess``; default: pixels / 255). With ``shard=(rank, world_size)`` every rank
    evaluates its part of each batch and the totals are summed over the ranks (a collective).
    ``check_stop`` (a callable, or None) runs before each batch and may raise to stop the pass there
    (a training run's Ctrl-C during its test pass).
    """
    model.eval()
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    total_loss = total_margin = total_recon = 0.0
    with tc.no_grad():
        for x, y in BatchIterator(images, labels, batch_size, preprocess=preprocess, shard=shard):
            if check_stop is not None:
                check_stop()
            loss, margin, recon, predicted = batch_losses(model, x, y, reconstruction_weight, train=False)
            np.add.at(confusion, (y, predicted), 1)
            total_loss += loss.item() * len(y)
            total_margin += float(tc.backend.to_numpy(margin.data).sum())
            total_recon += float(tc.backend.to_numpy(recon.data).sum())
            if progress is not None:
                progress.update(len(y))
    if shard[1] > 1:
        totals = np.array([total_loss, total_margin, total_recon])
        tc.distributed.all_reduce(confusion)
        total_loss, total_margin, total_recon = tc.distributed.all_reduce(totals).tolist()
    n = max(1, int(confusion.sum()))
    return {"accuracy": float(np.trace(confusion) / n), "loss": total_loss / n, "margin_loss": total_margin / n,
            "reconstruction_loss": total_recon / n, "confusion": confusion}


class Trainer:
    """One training run: the data, the model, the optimizer and schedule, and the run folder.

    ``config``: a TrainingConfig, or its dict form (config.json's); ``out_dir``: the run folder, a
    path or a RunFolder (all a run needs, in any process, is those two). ``cuda_graph`` ("auto", "on",
    "off"; default ``config.cuda_graph``): on a GPU
    the training step is captured as a CUDA graph after two eager warm-up batches and replayed for
    every full batch (``tinygrad_caps.cuda_graphs``); "auto" says in one line why not where it
    cannot, "on" makes that a UsageError, the CPU ignores "auto". A captured run computes exactly
    what an eager one does.
    """

    shard = (0, 1)        # (rank, world_size); distributed_training.DistributedTrainer sets both
    writes_files = True
    deadline = None       # a time.monotonic() value: at the first batch boundary after it, save and stop
    bar = None            # the epoch's progress bar while one is drawn

    def __init__(self, config: dict, out_dir, resume: bool = False, show_progress: bool = True, log=print,
                 cuda_graph: str | None = None):
        config = training_config(config, **({} if cuda_graph is None else {"cuda_graph": cuda_graph}))
        self.folder = out_dir if isinstance(out_dir, RunFolder) else RunFolder(out_dir)
        self.out_dir, self.show_progress, self.log = self.folder.path, show_progress, log
        self.last_path = self.folder.last
        self.signals, self.folder_ready, self.stdout_closed = StopSignals(), False, False
        device = device_or_usage_error(config.device)
        check_model_options(config.to_dict())  # options that do not go together: refused before the data loads
        # The registry gives the geometry and preprocessing; image_size and channels choose an image folder's.
        self.spec = dataset_spec(config.dataset, config.data_dir, config.image_size, config.channels)
        self.train_images, self.train_labels = limited(*self.spec.load("train", config.data_dir), config.limit_train)
        self.test_images, self.test_labels = limited(*self.spec.load("test", config.data_dir), config.limit_test)
        geometry = dict(in_channels=self.spec.channels, image_size=self.spec.image_size,
                        num_classes=self.spec.num_classes)
        self.config = config.replace(
            image_size=self.spec.image_size, network=dict(config.network, **geometry),
            augment=(self.spec.augment or "none") if config.augment == "default" else config.augment)
        self.weight = config.reconstruction_weight
        folder = find_dataset_dir(config.dataset, config.data_dir)
        self._say(f"data: {config.dataset}{f' from {folder}' if folder else ''}, {len(self.train_labels)} training "
                  f"and {len(self.test_labels)} test images, {self.spec.num_classes} classes")

        self.resuming = resume and self.last_path.exists()
        checkpoint = self._load_checkpoint() if self.resuming else None
        if self.resuming:
            self._keep_checkpoint_model_options(checkpoint["config"])
        self.config = self.config.replace(threads=self._thread_count(checkpoint))
        if self.config.model == "capsnet":
            check_fits(self.config.to_dict(), min(config.batch_size, len(self.train_labels)), config.dtype)
        tc.manual_seed(config.seed)
        self.model = build_model(self.config.to_dict()).to(device=device, dtype=config.dtype)
        self.graph_reason = self._cuda_graph_choice(config.cuda_graph, device)
        self.optimizer = tc.optim.Adam(self.model.parameters(), lr=config.lr, capturable=self.graph_reason is None)
        self.scheduler = tc.optim.ExponentialLR(self.optimizer, gamma=config.lr_decay)
        self.loader = BatchIterator(self.train_images, self.train_labels, config.batch_size, shuffle=True,
                                    augment=self.config.to_dict()["augment"], seed=config.seed,
                                    preprocess=self.spec.train_preprocess, shard=self.shard)
        self.state = {"epoch": 0, "step": 0, "sums": _zero_sums(), "best_accuracy": -1.0, "seconds": 0.0}
        # Metrics gather on the device; the host reads them after every batch on the CPU, every
        # FLUSH_EVERY batches on a GPU (and before every checkpoint and at the epoch's end).
        self.device_sums = DeviceSums(device)
        self.flush_every = 1 if device == "cpu" else FLUSH_EVERY
        self.captured_step = None
        self.mode_cosine = None  # the last logged step's cosines between the routing-gradient modes
        if config.log_mode_cosine and self.shard[1] > 1:
            raise UsageError("--log-mode-cosine needs one process: its extra backward would run on rank 0 alone")
        if config.log_mode_cosine and isinstance(self.model, CapsNet) and len(supported_modes(self.model)) < 2:
            raise UsageError(f"--log-mode-cosine: routing {self.model.config.routing!r} is not iterative; it has "
                             "one gradient mode, so there is no other mode to compare with")
        self.tensorboard, self.tensorboard_wanted = None, config.tensorboard is not None
        every = config.log_gradflow
        self.gradflow_log = GradflowLog(self.folder.gradflow, every, fresh=not self.resuming) if every else None
        if self.resuming:
            self.restore(checkpoint)
        elif resume:
            self._say(f"nothing to resume in {self.out_dir}; starting afresh")

    def _cuda_graph_choice(self, mode: str, device: str):
        """None when the training step will be captured as a CUDA graph, else why not (``mode``:
        "auto" captures where it can and says why not on a GPU; "on" makes that a UsageError;
        "off" never captures)."""
        if mode not in tc.cuda_graphs.MODES:
            raise UsageError(f"--cuda-graph must be one of {', '.join(tc.cuda_graphs.MODES)}, got {mode!r}")
        if mode == "off":
            return "--cuda-graph off"
        reason = tc.cuda_graphs.capture_unavailable_reason(device)
        if reason is None and self.shard[1] > 1:
            reason = "distributed training runs its collectives outside a graph"
        if reason is None and not tc.kernels.raw_kernels_enabled():
            reason = "TINYGRAD_CAPS_RAW_KERNELS=0 sends the capsule ops to CuPy's einsum, which calls cuBLAS"
        if reason is None and isinstance(self.model, BaselineCNN) and self.model.dropout > 0:
            reason = "the CNN's dropout draws a new mask each step (use --dropout 0 to capture)"
        if reason is None and getattr(self.model, "loss_follows_progress", False):
            reason = "the spread loss's margin changes every step, and a captured step would keep its first"
        if reason is not None and mode == "on":
            raise UsageError(f"--cuda-graph on: the training step cannot be captured: {reason}")
        if reason is not None and device != "cpu":
            self._say(f"CUDA graph: off ({reason})")
        return reason

    def _train_step(self, images, labels, traces=None):
        """One optimizer step on a batch on the device (``images`` a Tensor, ``labels`` an array),
        its metrics added to the device sums; what a CUDA graph captures (with ``traces`` None)."""
        loss, margin, recon, predicted = device_losses(self.model, images, labels, self.weight, train=True,
                                                       traces=traces)
        if self.flush_every == 1:  # the CPU: checked before the step reaches the weights
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise TrainingDiverged(f"the training loss became non-finite ({loss_value}) at epoch "
                                       f"{self.state['epoch'] + 1}, batch {self.state['step'] + 1}; {self._last_good()}; "
                                       "try a smaller --lr")
        self.optimizer.zero_grad()
        loss.backward()
        self._check_gradients()
        if traces is not None and self.config.log_mode_cosine and isinstance(self.model, CapsNet):
            self.mode_cosine = mode_gradient_cosines(self.model, images, labels, self.weight)
        self.optimizer.step()
        self.device_sums.add(loss, margin, recon, predicted, labels, labels.shape[0])

    def _run_batch(self, x, y, traces):
        """Train on one host batch: replayed from the CUDA graph when the step is captured (after its
        warm-up) and the batch is full, else eagerly (a last, smaller batch; a logged gradflow step).
        A CapsNet first learns where the run is (its loss's margin schedule reads it)."""
        if isinstance(self.model, CapsNet):
            self.model.set_training_position(self._global_step(), max(1, len(self.loader)), self.config.epochs)
        if self.graph_reason is None and traces is None and len(y) == self.config.batch_size // self.shard[1]:
            if self.captured_step is None:
                with tc.backend.on_device(self.model.device):
                    images = tc.zeros(x.shape, dtype=x.dtype, device=self.model.device)
                    labels = tc.zeros(y.shape, dtype=np.int64, device=self.model.device)
                self.captured_step = tc.cuda_graphs.CapturedStep(
                    lambda: self._train_step(images, labels.data), [images, labels], warmup=2)
            try:
                self.captured_step(x, y.astype(np.int64, copy=False))
                return
            except tc.cuda_graphs.CaptureError as exc:
                self._capture_failed(exc)  # "auto": this batch and the rest run eagerly
        with tc.backend.on_device(self.model.device):
            images = tc.tensor(x, device=self.model.device)
            self._train_step(images, tc.backend.asarray_like(y, images.data), traces)

    def _capture_failed(self, exc) -> None:
        """A capture that failed recorded work without running it: with --cuda-graph on that is a
        UsageError; with auto the run says why in one line and goes on eagerly (the failed batch too)."""
        if self.config.cuda_graph == "on":
            raise UsageError(f"--cuda-graph on: {exc}") from None
        self.captured_step = None
        self.graph_reason = str(exc)
        self._say(f"CUDA graph: off ({exc}); training goes on without it")

    def _flush_sums(self) -> None:
        """Read the device sums into the epoch's running sums (TrainingDiverged if one is not finite),
        and give TensorBoard the interval's means."""
        sums = self.state["sums"]
        if not self.device_sums.flush(sums):
            raise TrainingDiverged(f"the training loss became non-finite by epoch {self.state['epoch'] + 1}, batch "
                                   f"{self.state['step']}; {self._last_good()}; try a smaller --lr")
        start, self.interval_start = self.interval_start, (dict(sums), time.perf_counter())
        seen = sums["seen"] - start[0]["seen"]
        log = self._tensorboard_log()
        if log is not None and seen > 0:
            elapsed = time.perf_counter() - start[1]
            log.interval(self._global_step(), {
                "loss": (sums["loss"] - start[0]["loss"]) / seen,
                "accuracy": (sums["correct"] - start[0]["correct"]) / seen, "lr": float(self.optimizer.lr),
                "images_per_second": seen * self.shard[1] / elapsed if elapsed > 0 else None})

    def _tensorboard_log(self):
        """The run's TensorBoardLog once the run folder exists (``--tensorboard``), else None; a missing
        tensorboardX is said once, and the run goes on with its JSON-lines logs."""
        if not self.tensorboard_wanted or not self.writes_files or not self.folder_ready:
            return None
        if self.tensorboard is None:
            folder = self.config.tensorboard or self.folder.tensorboard
            try:
                # a fresh start purges from step 0: events of an earlier attempt that left no checkpoint
                self.tensorboard = TensorBoardLog(folder, purge_step=self.resumed_step + 1 if self.resuming else 0)
            except TensorBoardUnavailable as exc:
                self._say(f"tensorboard: not written ({exc}); metrics.jsonl and gradflow.jsonl are")
                self.tensorboard_wanted = False
                return None
        return self.tensorboard

    def _tensorboard_epoch(self, record: dict) -> None:
        """The epoch's metrics line and, for a CapsNet, 8 test images over their reconstructions."""
        log = self._tensorboard_log()
        if log is None:
            return
        log.epoch(record)
        if isinstance(self.model, CapsNet):
            images = self.spec.preprocess(self.test_images[:8])  # as evaluated: no augmentation
            with tc.no_grad(), tc.backend.on_device(self.model.device):
                self.model.eval()
                x = tc.tensor(images, device=self.model.device)
                outputs = self.model(x)
            log.reconstructions(record["step"], images, outputs.reconstruction.data)
        log.flush()

    def _load_checkpoint(self) -> dict:
        """``last.npz``, with its whole structure validated (warnings printed to stderr)."""
        checkpoint = tc.load(self.last_path)
        for warning in validate_training_checkpoint(checkpoint, self.last_path):
            print(f"tinygrad-caps: warning: {warning}", file=sys.stderr)
        return checkpoint

    def ensure_run_folder(self) -> None:
        """Create the run folder (once the first batch has trained): ``config.json``, ``metrics.jsonl``
        (emptied, or cut to the checkpoint's epochs on resume) and ``checkpoints/`` without stale temporaries."""
        if self.folder_ready:
            return
        self.last_path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.last_path.parent)
        write_text_atomically(self.folder.config,
                              json.dumps(dict(self.config.to_dict(), version=tc.__version__), indent=2))
        metrics = self.folder.metrics
        if self.resuming:
            dropped = keep_metrics_through_epoch(metrics, self.state["epoch"])
            if dropped:
                self._say(f"dropped {dropped} line{'s' * (dropped > 1)} of {metrics} beyond the checkpoint's "
                          f"epoch {self.state['epoch']}")
            dropped = keep_gradflow_through_step(self.folder.gradflow, self.resumed_step)
            if dropped:
                self._say(f"dropped {dropped} line{'s' * (dropped > 1)} of {self.out_dir / 'gradflow.jsonl'} "
                          f"beyond the checkpoint's step {self.resumed_step} (or cut short)")
        else:
            write_text_atomically(metrics, "")
        self.folder_ready = True
        self._say(f"run folder: {self.out_dir}")

    def _say(self, text: str) -> None:
        """Log ``text`` (above a progress bar being drawn, not onto its line); if stdout is a closed
        pipe, silence it and ask the run to stop and save."""
        try:
            if self.bar is not None and not self.bar.disable and self.log is print:
                self.bar.write(text)  # clears the bar, prints, redraws it below
            else:
                self.log(text)
        except BrokenPipeError:
            self.stdout_closed = True
            _silence_stdout()

    def _check_finite_weights(self, what: str) -> None:
        for name, p in self.model.named_parameters():
            if not bool(p.xp.isfinite(p.data).all()):
                raise TrainingDiverged(f"{what}: parameter {name} became non-finite (NaN or Inf); "
                                       f"{self._last_good()}; try a smaller --lr")

    def _last_good(self) -> str:
        if self.last_path.exists():
            return f"the last good checkpoint {self.last_path} is kept"
        return "no checkpoint was written"

    def _thread_count(self, checkpoint) -> int:
        """The threads the run computes with: the config's, else (on resume) the checkpoint's, else
        ``default_threads()``. A resumed run given another count than it trained with is warned that
        its results will differ in their last bits from a run never stopped."""
        saved = (checkpoint or {}).get("config", {}).get("threads")
        if self.config.threads is None:
            return saved or default_threads()
        if saved and saved != self.config.threads:
            self._say(f"warning: {self.out_dir} trained with {plural(saved, 'thread')} and continues with "
                      f"{self.config.threads}: BLAS then sums in another order, so its results will differ in "
                      f"their last bits from a run never stopped (--threads {saved} keeps them identical)")
        return self.config.threads

    def _keep_checkpoint_model_options(self, saved: dict):
        """On resume the model is the checkpoint's: a model option that ``config`` leaves unset is
        taken from it, and one set to another value is refused (UsageError naming both values)."""
        current = self.config.to_dict()
        for key in ("model",) + MODEL_OPTIONS:
            if key not in saved:
                continue
            if current.get(key) is not None and _as_json(current[key]) != _as_json(saved[key]):
                raise UsageError(f"--resume: the run's {key} is {saved[key]!r}, not {current[key]!r}; "
                                 "a run continues with its own model (start a new run with another --out)")
            current[key] = saved[key]
        self.config = training_config(current)

    def restore(self, checkpoint):
        validate_optimizer(checkpoint["optimizer"], self.last_path, [p.shape for p in self.optimizer.params])
        progress = checkpoint["progress"]
        step, seen = progress["step"], progress["sums"]["seen"]
        if step > len(self.loader) or seen > step * self.config.batch_size or (step > 0) != (seen > 0):
            raise tc.CheckpointError(f"{self.last_path}: progress (batch {progress['step']}, "
                                     f"{progress['sums']['seen']} images seen) does not fit {len(self.train_labels)} "
                                     f"training images in batches of {self.config.batch_size}; was --batch-size "
                                     "or --limit-train changed?")
        try:
            self.model.load_state_dict(checkpoint["model"])
        except tc.StateDictError as exc:
            raise tc.CheckpointError(f"{self.last_path}: {exc}") from exc
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        try:
            tc.random.set_rng_state(checkpoint["rng"])
        except (ValueError, TypeError, KeyError) as exc:
            raise tc.CheckpointError(f"{self.last_path}: rng holds an unusable generator state ({exc})") from exc
        self.state = progress
        self.resumed_step = self._global_step()  # the gradflow log is cut back to it
        if self.state["epoch"] >= self.config.epochs:
            self._say(f"{self.out_dir} has trained its {plural(self.state['epoch'], 'epoch')}: nothing to train "
                      f"(--epochs N with N > {self.state['epoch']} extends it)")
        else:
            self._say(f"resuming {self.out_dir} at epoch {self.state['epoch'] + 1}, batch {self.state['step']}")

    def save(self, path):
        """Write a checkpoint of the whole run state to ``path`` (refused if a weight is non-finite)."""
        self.ensure_run_folder()
        self._check_finite_weights(f"not saving {path}")
        tc.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "rng": tc.random.get_rng_state(), "progress": self.state,
                 "config": self.config.to_dict()}, path)

    def run(self) -> list:
        """Train until the configured epoch count; returns the metrics of the epochs run here."""
        previous = tc.get_matmul_precision()
        tc.set_matmul_precision(self.config.matmul_precision)
        try:
            with run_threads(self.config.threads):
                return self._run()
        finally:
            tc.set_matmul_precision(previous)
            if self.tensorboard is not None:
                self.tensorboard.close()

    def _run(self) -> list:
        history = []
        with self.signals as stop:
            try:
                while self.state["epoch"] < self.config.epochs:
                    self._check_stop(stop)
                    self.train_epoch(stop)
                    self._check_stop(stop)
                    history.append(self.finish_epoch(stop))
                self._check_signals(stop)  # a Ctrl-C in the last test pass stops a study too, not only this run
            except KeyboardInterrupt as exc:
                with stop.critical(raise_pending=False):
                    self.save(self.last_path)
                why = "time limit reached" if isinstance(exc, TimeLimitReached) else "interrupted"
                print(f"{why}: saved {self.last_path} (epoch {self.state['epoch'] + 1}, batch "
                      f"{self.state['step']}); continue with: {self.resume_command()}", file=sys.stderr)
                raise exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT) from None
        self.ensure_run_folder()
        return history

    def resume_command(self) -> str:
        """The command that continues this run (its options come from its config.json)."""
        return f"tinygrad-caps train --resume --out {shlex.quote(str(self.out_dir))}"

    def _check_gradients(self) -> None:
        """After each backward: nothing to check on one process (see DistributedTrainer)."""

    def _check_signals(self, stop) -> None:
        """Raise Interrupted where a stop signal arrived or stdout was closed."""
        if self.stdout_closed:
            raise Interrupted(signal.SIGPIPE)
        stop.check()

    def _check_stop(self, stop) -> None:
        """``_check_signals``, then TimeLimitReached once the deadline has passed (at batch boundaries)."""
        self._check_signals(stop)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimeLimitReached()

    def train_epoch(self, stop):
        """Train on the rest of the current epoch's batches, adding to the running sums."""
        state, sums = self.state, self.state["sums"]
        self.loader.set_epoch(state["epoch"])
        started = time.perf_counter()
        self.interval_start = (dict(sums), started)
        bar = self.bar = _progress(len(self.train_images), f"epoch {state['epoch'] + 1}/{self.config.epochs}",
                                   self.show_progress)
        if bar is not None:
            bar.update(min(len(self.train_images), state["step"] * self.config.batch_size))
        self.model.train()
        try:
            for x, y in self.loader.batches(state["step"]):
                self._check_stop(stop)
                with stop.critical():  # a batch is applied and counted whole, or not at all
                    traces = [] if self._gradflow_due() else None
                    self._run_batch(x, y, traces)
                    crash_point("optimizer-step")
                    sums["seen"] += len(y)
                    state["step"] += 1
                self.ensure_run_folder()
                flush = state["step"] % self.flush_every == 0
                if flush:
                    with stop.critical():
                        self._flush_sums()
                if traces and self.writes_files:
                    record = self.gradflow_log.write(state["epoch"] + 1, state["step"], self._global_step(),
                                                     self.model.digit.gradient, traces,
                                                     self.mode_cosine if self.config.log_mode_cosine else None)
                    tensorboard = self._tensorboard_log()
                    if tensorboard is not None:
                        tensorboard.gradflow(record, traces, self.model.named_parameters())
                if bar is not None:  # tqdm itself shows images/s
                    bar.update(len(y) * self.shard[1])  # every rank trained on as many images
                    if flush:
                        bar.set_postfix(loss=f"{sums['loss'] / sums['seen']:.4f}",
                                        acc=f"{sums['correct'] / sums['seen']:.3f}")
        finally:
            try:
                with stop.critical(raise_pending=False):
                    self._flush_sums()  # the sums a checkpoint or the epoch's line will read
            finally:
                state["seconds"] += time.perf_counter() - started
                if bar is not None:
                    bar.close()
                self.bar = None

    def _global_step(self) -> int:
        """Training steps done over the whole run (1-based once the first batch has trained)."""
        return self.state["epoch"] * len(self.loader) + self.state["step"]

    def _gradflow_due(self) -> bool:
        """Whether ``--log-gradflow`` logs the coming step (a CapsNet's; the baseline CNN has no routing).
        With several ranks only rank 0 logs, the statistics of its own part of the batch."""
        return (self.gradflow_log is not None and isinstance(self.model, CapsNet) and self.shard[0] == 0
                and self.gradflow_log.due(self._global_step() + 1))

    def finish_epoch(self, stop=None) -> dict:
        """Evaluate, then commit the epoch as one unit: its metrics line, the schedule step, the checkpoints.

        With ``stop`` (the run's StopSignals) a Ctrl-C or the time limit stops the test pass at its
        next batch; the checkpoint then holds the whole trained epoch, whose test pass runs again on resume.
        """
        state, sums = self.state, self.state["sums"]
        test = evaluate(self.model, self.test_images, self.test_labels, self.config.batch_size,
                        self.config.network["num_classes"], self.weight, preprocess=self.spec.test_preprocess,
                        shard=self.shard, check_stop=None if stop is None else lambda: self._check_stop(stop))
        record = {"epoch": state["epoch"] + 1, "train_loss": sums["loss"] / sums["seen"],
                  "train_margin_loss": sums["margin_loss"] / sums["seen"],
                  "train_reconstruction_loss": sums["reconstruction_loss"] / sums["seen"],
                  "train_accuracy": sums["correct"] / sums["seen"], "test_loss": test["loss"],
                  "test_margin_loss": test["margin_loss"], "test_reconstruction_loss": test["reconstruction_loss"],
                  "test_accuracy": test["accuracy"], "lr": self.optimizer.lr, "seconds": state["seconds"],
                  "step": self._global_step()}
        if not all(math.isfinite(v) for v in record.values()):
            raise TrainingDiverged(f"epoch {record['epoch']} ended with non-finite metrics ({record}); "
                                   f"{self._last_good()}; try a smaller --lr")
        self._check_finite_weights(f"epoch {record['epoch']}")
        with self.signals.critical():
            self.ensure_run_folder()
            # TensorBoard first: events past the checkpoint a crash leaves are purged on resume, while
            # an epoch written after its checkpoint would be lost by a crash in between
            self._tensorboard_epoch(record)
            if self.writes_files:
                append_metrics_line(self.folder.metrics, json.dumps(record))
            crash_point("metrics-line")
            self.scheduler.step()
            improved = test["accuracy"] > state["best_accuracy"]
            state.update(epoch=state["epoch"] + 1, step=0, sums=_zero_sums(), seconds=0.0,
                         best_accuracy=max(state["best_accuracy"], test["accuracy"]))
            if improved:
                self.save(self.folder.best)
            self.save(self.last_path)
            crash_point("checkpoint")
        self._say(f"epoch {record['epoch']}: train loss {record['train_loss']:.4f} acc {record['train_accuracy']:.4f} | "
                  f"test loss {record['test_loss']:.4f} acc {record['test_accuracy']:.4f} | {record['seconds']:.0f}s")
        return record


def train(config: dict, out_dir, resume: bool = False, show_progress: bool = True, log=print,
          cuda_graph: str | None = None) -> list:
    """Train a CapsNet as ``config`` says (the CLI's options); returns the per-epoch metrics.

    ``config`` is a TrainingConfig or its dict form. ``config.cuda_graph`` ("auto" by default, "on",
    "off") captures the training step as a CUDA graph on a GPU; ``config.matmul_precision``
    ("highest" by default, or "high": TF32) is the
    precision of the GPU's matrix products and convolutions while the run trains.

    Writes ``config.json``, appends one line per epoch to ``metrics.jsonl``, and keeps
    ``checkpoints/last.npz`` (also on Ctrl-C, at the next batch boundary) and ``checkpoints/best.npz``.
    """
    # The run's GPU is current while it trains (CuPy allocates on the current GPU) and no longer after.
    with tc.backend.on_device(device_or_usage_error(training_config(config).device)):
        return Trainer(config, out_dir, resume, show_progress, log, cuda_graph=cuda_graph).run()


def training_config(config, **changes) -> TrainingConfig:
    """``config`` (a TrainingConfig, or a run's options as a dict: config.json's form) with ``changes``
    as a TrainingConfig; a bad or unknown option is a UsageError naming its command-line option."""
    try:
        config = config if isinstance(config, TrainingConfig) else TrainingConfig.from_dict(config)
        return config.replace(**changes) if changes else config
    except OptionError as exc:
        raise UsageError(f"{option_flag(exc.field)} {exc.reason}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def limited(images, labels, limit):
    """The first ``limit`` images and labels (all of them when ``limit`` is 0 or None)."""
    return (images, labels) if not limit else (images[:limit], labels[:limit])


def _silence_stdout() -> None:
    """Point stdout at /dev/null (after its reader went away), so later prints cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        sys.stdout = open(os.devnull, "w")
    finally:
        os.close(devnull)


def _as_json(value):
    """``value`` as JSON sees it (tuples are lists), for comparing options with a checkpoint's."""
    return json.loads(json.dumps(value))


FLUSH_EVERY = 50  # batches between the GPU's metric reads (the progress bar's loss and accuracy)


def _zero_sums():
    return {"loss": 0.0, "margin_loss": 0.0, "reconstruction_loss": 0.0, "correct": 0, "seen": 0}


