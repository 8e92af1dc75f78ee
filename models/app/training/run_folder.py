"""A training run's folder, named once: ``RunFolder(path)`` holds the path of every file a run writes.

    RUN/config.json           the run's options (TrainingConfig.to_dict, with the version)
    RUN/metrics.jsonl         one line per epoch
    RUN/gradflow.jsonl        with --log-gradflow: one line per logged step
    RUN/checkpoints/last.npz  the whole run state (after every epoch, and when the run is stopped)
    RUN/checkpoints/best.npz  the model of the epoch with the best test accuracy
    RUN/tensorboard/          with --tensorboard and no folder of its own
    RUN/train.log             a study's run: what its process printed
    RUN/run.lock              a study's run: while a process trains it (``studies.lock.run_lock``)
    RUN/failed.json           a study's run: its last failure (``studies.outcome.Failure``)

Everything that reads or writes a run folder asks this class for the names, so a process that trains
a run elsewhere (a study's executor) needs exactly a ``TrainingConfig`` and a ``RunFolder``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class RunFolder:
    """The files of the run folder ``path`` (nothing is created or checked here)."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def gradflow(self) -> Path:
        return self.path / "gradflow.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.npz"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.npz"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def train_log(self) -> Path:
        return self.path / "train.log"

    @property
    def lock(self) -> Path:
        return self.path / "run.lock"

    @property
    def failed(self) -> Path:
        return self.path / "failed.json"

    def holds_a_run(self) -> bool:
        """Whether a training run wrote here: its config.json beside its metrics or its checkpoints."""
        return self.config.is_file() and (self.metrics.is_file() or self.checkpoints.is_dir())

    def checkpoint(self) -> Path | None:
        """``best.npz``, else ``last.npz`` (no epoch has finished), else None."""
        return next((path for path in (self.best, self.last) if path.is_file()), None)

    @staticmethod
    def of_checkpoint(checkpoint) -> Path:
        """The run folder of a checkpoint: RUN for RUN/checkpoints/NAME.npz, else the checkpoint's folder."""
        parent = Path(checkpoint).absolute().parent
        return parent.parent if parent.name == CHECKPOINTS else parent
