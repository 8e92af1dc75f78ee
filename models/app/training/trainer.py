"""The training loop of a run: ``Trainer``, epochs of steps, the test pass and each epoch's commit,
with its parts called at fixed points (``callbacks``): the checks before data (``preflight``), the
data (``run_data``), the step (``step_runner``), the checkpoints (``checkpointing``), the stop
conditions (``stopping``) and the sinks (``metrics_file``, ``progress``, ``tensorboard_sink``,
``gradflow_log``); ``train`` runs one. A model is rebuilt from a checkpoint in ``checkpoints``.

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
import signal
import sys
import time

import tinygrad_caps as tc

from ...errors import TrainingDiverged
from .callbacks import Parts, StepDone
from .checkpointing import RunCheckpoints, check_finite_weights
from .checkpoints import build_model
from .config import TrainingConfig, training_config
from .evaluation import batch_losses, device_losses, evaluate  # noqa: F401  (the loop's public names, as before)
from .gradflow_log import GradflowSink
from .metrics_file import MetricsFile
from .option_checks import device_or_usage_error
from .preflight import preflight
from .progress import ProgressBar
from .run_data import limited  # noqa: F401  (kept here: a patch of the old module path reaches it)
from .run_data import RunData
from .run_folder import RunFolder
from .run_state import Interrupted, TimeLimitReached, crash_point, remove_stale_temporaries, write_text_atomically
from .stopping import StopConditions
from .step_runner import StepRunner
from .tensorboard_sink import TensorBoardSink
from .threads import run_threads


class Trainer:
    """One run's loop: epochs of steps, the test pass, the commit; parts at fixed points.

    ``config``: a TrainingConfig, or its dict form (config.json's); ``out_dir``: the run folder, a
    path or a RunFolder (all a run needs, in any process, is those two). ``cuda_graph`` ("auto", "on",
    "off"; default ``config.cuda_graph``): whether the step is captured as a CUDA graph on a GPU
    (``step_runner``). ``deadline`` (a time.monotonic() value) stops the run, saved, at the first batch
    boundary after it once it has moved on from where it started; ``stop_file`` stops it (as Ctrl-C
    does) once that file exists. ``parts``: the parts called at fixed points (``callbacks``; default
    TensorBoard, metrics file, gradflow log and progress bar), in the order each hook calls them.
    """

    shard = (0, 1)        # (rank, world_size); distributed.DistributedTrainer sets both
    writes_files = True
    stop_conditions = StopConditions  # (a distributed run's ranks agree on their stops)

    def __init__(self, config: TrainingConfig, out_dir, resume: bool = False, show_progress: bool = True, log=print,
                 cuda_graph: str | None = None, *, deadline=None, stop_file=None, parts=None):
        config = training_config(config, **({} if cuda_graph is None else {"cuda_graph": cuda_graph}))
        self.folder = out_dir if isinstance(out_dir, RunFolder) else RunFolder(out_dir)
        self.out_dir, self.last_path, self.log, self.folder_ready = self.folder.path, self.folder.last, log, False
        self.stopping, self.progress = self.stop_conditions(deadline, stop_file), ProgressBar(show_progress)
        setup = preflight(config, self.shard[1])  # every check before data
        self.config, self.data = setup.config, RunData(setup, self.shard)
        self.say(self.data.summary())
        self.checkpoints = RunCheckpoints(self.folder, resume)
        self.config = self.checkpoints.own_config(self.config, self.say)
        tc.manual_seed(config.seed)
        self.model = build_model(self.config.model_config).to(device=setup.device, dtype=config.dtype)
        self.steps = StepRunner(self, setup.device)
        self.optimizer = tc.optim.Adam(self.model.parameters(), lr=config.lr, capturable=self.graph_reason is None)
        self.scheduler = tc.optim.ExponentialLR(self.optimizer, gamma=config.lr_decay)
        self.state = {"epoch": 0, "step": 0, "sums": _zero_sums(), "best_accuracy": -1.0, "seconds": 0.0}
        self.parts = Parts(default_parts(self) if parts is None else parts)
        if self.checkpoints.resuming:
            self.restore(self.checkpoints.checkpoint)
        elif resume:
            self.say(f"nothing to resume in {self.out_dir}; starting afresh")

    @property
    def graph_reason(self):
        """Why the training step is not captured as a CUDA graph, or None when it is."""
        return self.steps.graph_reason

    @property
    def deadline(self):
        """The time limit in force now: None until the run has moved on from where it started."""
        return self.stopping.deadline_now((self.state["epoch"], self.state["step"]))

    @deadline.setter
    def deadline(self, value):
        self.stopping.deadline = value

    def run(self) -> list:
        """Train until the configured epoch count; returns the metrics of the epochs run here."""
        previous = tc.get_matmul_precision()
        tc.set_matmul_precision(self.config.matmul_precision)
        try:
            with run_threads(self.config.threads):
                return self._run()
        finally:
            tc.set_matmul_precision(previous)
            self.parts.close(self)

    def _run(self) -> list:
        history = []
        with self.stopping:
            try:
                while self.state["epoch"] < self.config.epochs:
                    self.check_stop()
                    self.train_epoch(self.stopping)
                    self.check_stop()
                    history.append(self.finish_epoch(self.stopping))
                self._check_signals(self.stopping)  # a Ctrl-C in the last test pass stops a study too
            except KeyboardInterrupt as exc:
                with self.stopping.critical(raise_pending=False):
                    self.save(self.last_path)
                why = "time limit reached" if isinstance(exc, TimeLimitReached) else "interrupted"
                print(f"{why}: saved {self.last_path} (epoch {self.state['epoch'] + 1}, batch {self.state['step']}); "
                      f"continue with: {self.stopping.resume_command(self)}", file=sys.stderr)
                raise exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT) from None
        self.ensure_run_folder()
        return history

    def _check_signals(self, stop) -> None:
        """Interrupted where a signal, a closed stdout or the stop file asks to stop (a subclass may add)."""
        stop.check_signals(self)

    def check_stop(self) -> None:
        """At a batch boundary: Interrupted (``_check_signals``), or TimeLimitReached past the deadline."""
        self._check_signals(self.stopping)
        self.stopping.check_deadline(self.deadline, time.monotonic)  # (the loop's clock, which a test may stand in for)

    def train_epoch(self, stop=None):
        """Train on the rest of the current epoch's batches, adding to the running sums."""
        state = self.state
        self.data.loader.set_epoch(state["epoch"])
        started = time.perf_counter()
        self.parts.on_epoch_start(self)
        self.model.train()
        try:
            for x, y in self.data.loader.batches(state["step"]):
                self.check_stop()
                with self.stopping.critical():  # a batch is applied and counted whole, or not at all
                    traces = [] if self.parts.wants_traces(self, self.global_step() + 1) else None
                    self.steps.step(x, y, traces)
                    crash_point("optimizer-step")
                    state["sums"]["seen"] += len(y)
                    state["step"] += 1
                self.ensure_run_folder()
                flushed = state["step"] % self.steps.flush_every == 0
                if flushed:
                    with self.stopping.critical():
                        self.flush_sums()
                self.parts.on_step(self, StepDone(len(y), traces, flushed))
        finally:
            try:
                with self.stopping.critical(raise_pending=False):
                    self.flush_sums()  # the sums a checkpoint or the epoch's line will read
            finally:
                state["seconds"] += time.perf_counter() - started
                self.parts.on_epoch_trained(self)

    def flush_sums(self) -> None:
        """Read the device sums into the epoch's running sums (TrainingDiverged if one is not finite);
        the parts' ``on_interval``."""
        self.steps.flush(self.state["sums"])
        self.parts.on_interval(self)

    def global_step(self) -> int:
        """Training steps done over the whole run (1-based once the first batch has trained)."""
        return self.state["epoch"] * len(self.data.loader) + self.state["step"]

    def finish_epoch(self, stop=None) -> dict:
        """Evaluate, then commit the epoch as one unit: its metrics line, the schedule step, the checkpoints.

        With ``stop`` (the run's StopConditions) a Ctrl-C or the time limit stops the test pass at its
        next batch; the checkpoint then holds the whole trained epoch, whose test pass runs again on resume.
        """
        state, data = self.state, self.data
        test = evaluate(self.model, data.test_images, data.test_labels, self.config.batch_size,
                        self.config.network["num_classes"], self.config.reconstruction_weight,
                        preprocess=data.spec.test_preprocess, shard=self.shard,
                        check_stop=None if stop is None else self.check_stop)
        record = epoch_record(state, test, self.optimizer.lr, self.global_step())
        if not all(math.isfinite(v) for v in record.values()):
            raise TrainingDiverged(f"epoch {record['epoch']} ended with non-finite metrics ({record}); "
                                   f"{self.checkpoints.last_good()}; try a smaller --lr")
        check_finite_weights(self.model, f"epoch {record['epoch']}", self.checkpoints.last_good())
        with self.stopping.critical():
            self.ensure_run_folder()
            self.parts.on_epoch_end(self, record)  # TensorBoard's events, then the fsynced metrics line
            crash_point("metrics-line")
            self.scheduler.step()
            improved = test["accuracy"] > state["best_accuracy"]
            state.update(epoch=state["epoch"] + 1, step=0, sums=_zero_sums(), seconds=0.0,
                         best_accuracy=max(state["best_accuracy"], test["accuracy"]))
            self.checkpoints.commit(self, improved)
            crash_point("checkpoint")
        self.say(f"epoch {record['epoch']}: train loss {record['train_loss']:.4f} acc {record['train_accuracy']:.4f} | "
                 f"test loss {record['test_loss']:.4f} acc {record['test_accuracy']:.4f} | {record['seconds']:.0f}s")
        return record

    def ensure_run_folder(self) -> None:
        """Create the run folder (once the first batch has trained): ``checkpoints/`` without stale
        temporaries, ``config.json``, then the parts' ``on_folder_ready`` (the metrics and gradflow logs)."""
        if self.folder_ready:
            return
        self.last_path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.last_path.parent)
        write_text_atomically(self.folder.config, json.dumps(dict(self.config.to_dict(), version=tc.__version__),
                                                             indent=2))
        self.parts.on_folder_ready(self)
        self.folder_ready = True
        self.say(f"run folder: {self.out_dir}")

    def save(self, path) -> None:
        """Write a checkpoint of the whole run state to ``path`` (refused if a weight is non-finite)."""
        self.checkpoints.save(self, path)

    def restore(self, checkpoint) -> None:
        """Load a checkpoint (``last.npz``'s contents) into the run (``RunCheckpoints.restore``)."""
        self.checkpoints.restore(self, checkpoint)

    def say(self, text: str) -> None:
        """Log ``text`` (above a progress bar being drawn, not onto its line); if stdout is a closed
        pipe, silence it and ask the run to stop and save."""
        try:
            self.progress.say(text, self.log)
        except BrokenPipeError:
            self.stopping.stdout_closed = True
            _silence_stdout()


def default_parts(run) -> list:
    """The parts of ``run`` (a Trainer): its files' sinks where its process writes them (TensorBoard
    before the metrics file: an epoch's events precede its fsynced line), and the progress bar."""
    config, sinks = run.config, []
    if run.writes_files and config.tensorboard is not None:
        sinks.append(TensorBoardSink(config.tensorboard or None))
    if run.writes_files:
        sinks += [MetricsFile(), GradflowSink(run.folder.gradflow, config.log_gradflow,
                                              fresh=not run.checkpoints.resuming)]
    return [*sinks, run.progress]


def epoch_record(state: dict, test: dict, lr: float, step: int) -> dict:
    """An epoch's metrics.jsonl line: the training means of ``state``'s sums, the ``test`` pass's, the
    learning rate ``lr``, the seconds trained and the global ``step``."""
    sums = state["sums"]
    return {"epoch": state["epoch"] + 1, "train_loss": sums["loss"] / sums["seen"],
            "train_margin_loss": sums["margin_loss"] / sums["seen"],
            "train_reconstruction_loss": sums["reconstruction_loss"] / sums["seen"],
            "train_accuracy": sums["correct"] / sums["seen"], "test_loss": test["loss"],
            "test_margin_loss": test["margin_loss"], "test_reconstruction_loss": test["reconstruction_loss"],
            "test_accuracy": test["accuracy"], "lr": lr, "seconds": state["seconds"], "step": step}


def train(config: TrainingConfig, out_dir, resume: bool = False, show_progress: bool = True, log=print,
          cuda_graph: str | None = None) -> list:
    """Train a CapsNet as ``config`` says (the CLI's options); returns the per-epoch metrics.

    ``config`` is a TrainingConfig or its dict form. ``config.cuda_graph`` ("auto" by default, "on",
    "off") captures the training step as a CUDA graph on a GPU; ``config.matmul_precision``
    ("highest" by default, or "high": TF32) is the
    precision of the GPU's matrix products and convolutions while the run trains.

    Writes ``config.json``, appends one line per epoch to ``metrics.jsonl``, and keeps
    ``checkpoints/last.npz`` (also on Ctrl-C, at the next batch boundary) and ``checkpoints/best.npz``.
    """
    config = training_config(config)
    # The run's GPU is current while it trains (CuPy allocates on the current GPU) and no longer after.
    with tc.backend.on_device(device_or_usage_error(config.device)):
        return Trainer(config, out_dir, resume, show_progress, log, cuda_graph=cuda_graph).run()


def _silence_stdout() -> None:
    """Point stdout at /dev/null (after its reader went away), so later prints cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        sys.stdout = open(os.devnull, "w")
    finally:
        os.close(devnull)


def _zero_sums():
    return {"loss": 0.0, "margin_loss": 0.0, "reconstruction_loss": 0.0, "correct": 0, "seen": 0}
