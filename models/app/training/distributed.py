"""Training on several processes: the pieces the ``train --distributed`` loop adds to a single-process run.

Every rank runs the same Trainer on its shard of each global batch (``BatchIterator(shard=...)``)
with the model wrapped in ``DistributedDataParallel``; the metric sums are added over the ranks
before they are reported, and only rank 0 writes files and prints. A rank that fails prints its
message and aborts every rank (``MPI.COMM_WORLD.Abort``), so no rank waits forever in a collective.
"""
from __future__ import annotations

import contextlib
import io
import shlex
import signal
import sys

import numpy as np

import tinygrad_caps.distributed as dist

from ...errors import UsageError
from .callbacks import TrainingPart
from .checkpointing import check_finite_weights
from .config import training_config
from .reporting import report
from .run_state import Interrupted
from .stopping import StopConditions
from .trainer import Trainer, _zero_sums


@contextlib.contextmanager
def abort_on_error(command: str = "train", debug: bool = False):
    """Context: in a group of several ranks, an exception on this rank is reported as the CLI
    reports it (one line for a user error, the traceback for a bug; ``reporting.report``), prefixed
    with the rank, and then every rank is aborted with that exit status (2 or 1).

    In a group of one the exception propagates unchanged. Without the abort, a failed rank would
    wait in MPI's finalization while the others wait for it in their next collective.
    """
    try:
        yield
    except Exception as exc:  # noqa: BLE001  (any failure must end every rank)
        if dist.world_size() == 1:
            raise
        text = io.StringIO()
        code = report(exc, command, debug, stream=text)
        dist.abort(text.getvalue().rstrip("\n"), code)
    # KeyboardInterrupt passes: every rank agrees on a stop at the same batch and exits by itself.


class DDPCheck(TrainingPart):
    """After each backward: every parameter's gradient was averaged over the ranks. The loop calls the
    module itself, so DDP's own check at forward never runs (a parameter without a gradient would
    otherwise leave the ranks' weights drifting apart in silence)."""

    def after_backward(self, run, images, labels, traces) -> None:
        run.ddp.check_all_reduced()


class AgreedStop(StopConditions):
    """The stop conditions of one rank: a stop is agreed on by every rank at once, at the same batch."""

    agreed = False  # whether the ranks agreed on the stop that is being handled

    def check_signals(self, run) -> None:
        """Stop where any rank asked to, on every rank at once: only the agreed flags count (a signal
        that lands during the all-reduce is taken up at the next batch)."""
        request = np.array([self.signals.requested or 0, int(self.stdout_closed)], dtype=np.int64)
        dist.all_reduce(request, op="max")
        if request[1]:
            self.agreed = True
            raise Interrupted(signal.SIGPIPE)
        if request[0]:
            self.agreed = True
            raise Interrupted(int(request[0]))

    def resume_command(self, run) -> str:
        """The command that continues the run: on as many processes, with the same launch options."""
        launch = " --sync-batchnorm" if run.config.sync_batchnorm else ""
        return (f"mpirun -n {run.shard[1]} tinygrad-caps train --distributed{launch} --resume --out "
                f"{shlex.quote(str(run.out_dir))}")


class DistributedTrainer(Trainer):
    """A Trainer for one rank of a data-parallel run (``tinygrad_caps.distributed.init()`` first).

    ``batch_size`` is the global batch; each rank trains on its slice with the model's gradients
    averaged by ``DistributedDataParallel`` (which also gives every rank rank 0's initial weights).
    ``sync_batchnorm`` replaces BatchNorm layers by SyncBatchNorm; without it each rank's batch
    norm uses its own slice's statistics, and the saved running statistics are rank 0's.
    Every rank stops at the same batch: a SIGINT/SIGTERM on any of them is agreed on at the next one
    (``AgreedStop``). Only rank 0 writes files (the sinks are its parts alone) and prints.
    The running metric sums are per rank during an epoch and summed over the ranks whenever they
    are reported or saved, so a checkpoint holds the global sums and ``--resume`` works.
    """

    stop_conditions = AgreedStop

    def __init__(self, config, out_dir, resume: bool = False, show_progress: bool = True, log=print,
                 sync_batchnorm: bool = False, bucket_mb: float = 25):
        world = dist.world_size()
        config = training_config(config)
        if config.batch_size % world:
            raise UsageError(f"--batch-size {config.batch_size} is the global batch and must divide by the "
                             f"number of processes, {world}")
        self.shard, self.writes_files = (dist.rank(), world), dist.rank() == 0
        super().__init__(config, out_dir, resume, show_progress and self.writes_files,
                         log if self.writes_files else _quiet)
        if sync_batchnorm:
            self.model = dist.convert_sync_batchnorm(self.model)
        # The hooks DDP puts on the parameters average every gradient; the loop keeps calling the module itself.
        self.ddp = dist.DistributedDataParallel(self.model, bucket_mb=bucket_mb)
        self.parts.insert(0, DDPCheck())

    def ensure_run_folder(self) -> None:
        if not self.writes_files:
            self.folder_ready = True
            return
        super().ensure_run_folder()

    def _global_sums(self) -> dict:
        sums = self.state["sums"]
        keys = list(sums)
        values = dist.all_reduce(np.array([float(sums[k]) for k in keys]))
        return {k: (int(round(v)) if isinstance(sums[k], int) else float(v)) for k, v in zip(keys, values)}

    def finish_epoch(self, stop=None) -> dict:
        self.state["sums"] = self._global_sums()
        return super().finish_epoch(stop)

    def save(self, path):
        """Every rank calls it (the metric sums are summed over ranks); rank 0 writes the file."""
        interrupted = sys.exc_info()[1]
        if isinstance(interrupted, KeyboardInterrupt) and not self.stopping.agreed:
            # a second signal stopped this rank mid-batch: the others cannot join a save
            dist.abort("tinygrad-caps train: interrupted twice: every process stops now, without saving; "
                       f"{self.checkpoints.last_good()}", 128 + getattr(interrupted, "signum", signal.SIGINT))
        local = self.state["sums"]
        self.state["sums"] = self._global_sums()
        try:
            if self.writes_files:
                super().save(path)
            else:
                check_finite_weights(self.model, f"not saving {path}", self.checkpoints.last_good())
        finally:
            self.state["sums"] = local

    def restore(self, checkpoint):
        super().restore(checkpoint)
        if not self.writes_files:  # the checkpoint's sums are global: count them once, on rank 0
            self.state["sums"] = _zero_sums()


def _quiet(*args, **kwargs):
    """The log of ranks other than 0: they print nothing."""


def train_distributed(config, out_dir, resume: bool = False, show_progress: bool = True,
                      sync_batchnorm: bool = False, log=print) -> list:
    """One rank's part of ``train --distributed``: join the group (if not yet) and train; returns the metrics."""
    config = training_config(config)
    if not dist.is_initialized():
        dist.init(backend="auto", device=config.device)
    trainer = DistributedTrainer(config, out_dir, resume, show_progress, log, sync_batchnorm=sync_batchnorm)
    return trainer.run()
