"""A study's folder, named once: ``StudyFolder(path)`` holds the path of every file a study writes,
and every module and command (the runner, the executors, the summary, ``plot``) asks it.

    DIR/study.json                          the plan (``plan.StudyPlan``)
    DIR/runs/<config_id>/seed-<seed>/       a run folder (``RunFolder``: config.json, metrics.jsonl,
                                            checkpoints/, train.log, run.lock, failed.json)
    DIR/summary.json, summary.md, summary.png
    DIR/study.lock                          while a ``study run`` drives the folder (``lock.study_lock``)
    DIR/study.stop                          while a stopped study's runs save (Ctrl-C)
    DIR/study.token                         the Ray executor's token every node must see
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ..training.run_folder import RunFolder
from ..training.run_state import write_text_atomically

STUDY_FILE = "study.json"
RUNS = "runs"


@dataclass(frozen=True)
class StudyFolder:
    """The one place that knows a study folder's layout (nothing is created or checked here)."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of(cls, folder) -> "StudyFolder":
        """``folder`` as a StudyFolder (a StudyFolder, or the path of one)."""
        return folder if isinstance(folder, StudyFolder) else cls(folder)

    @property
    def plan_file(self) -> Path:
        return self.path / STUDY_FILE

    @property
    def lock(self) -> Path:
        return self.path / "study.lock"

    @property
    def stop(self) -> Path:
        return self.path / "study.stop"

    @property
    def token(self) -> Path:
        return self.path / "study.token"

    @property
    def summary_json(self) -> Path:
        return self.path / "summary.json"

    @property
    def summary_md(self) -> Path:
        return self.path / "summary.md"

    @property
    def summary_png(self) -> Path:
        return self.path / "summary.png"

    @property
    def runs_dir(self) -> Path:
        return self.path / RUNS

    def run(self, config_id: str, seed: int) -> RunFolder:
        """DIR/runs/<config_id>/seed-<seed> as a RunFolder."""
        return RunFolder(self.path / self.run_path(config_id, seed))

    @staticmethod
    def run_path(config_id: str, seed: int) -> str:
        """runs/<config_id>/seed-<seed>, relative to the study folder, as study.json records it."""
        return f"{RUNS}/{config_id}/seed-{int(seed)}"

    def contains(self, path) -> bool:
        """Whether ``path`` is or lies inside this study's runs/ (links resolved)."""
        runs, target = _resolved(self.runs_dir), _resolved(Path(path))
        return runs == target or runs in target.parents

    def holds_a_study(self) -> bool:
        """Whether DIR/study.json exists."""
        return self.plan_file.is_file()

    @classmethod
    def around(cls, path) -> "StudyFolder | None":
        """The study whose runs/ holds the run folder ``path`` (STUDY/runs/CONFIG/seed-S), or None
        where ``path`` lies in no study's runs/ (its folder holds no study.json)."""
        run_dir = Path(path).absolute()
        if len(run_dir.parents) < 3 or run_dir.parents[1].name != RUNS:
            return None
        folder = cls(run_dir.parents[2])
        return folder if folder.holds_a_study() else None

    def check_place(self) -> None:
        """UsageError where DIR is, or lies inside, the run folder of a training run, or lies inside
        another study's runs/: a study there would mix its files with theirs."""
        target = _resolved(self.path)  # (a loop of links: check_out_folder has spoken where that matters)
        for folder in (target, *target.parents):
            if RunFolder(folder).holds_a_run():
                where = "is" if folder == target else f"lies inside {folder}, which is"
                raise UsageError(f"--out {self.path} {where} the run folder of a training run (config.json, "
                                 "checkpoints/); a study needs a folder of its own: choose another --out")
            other = StudyFolder(folder)
            if folder != target and other.holds_a_study() and other.runs_dir in (target, *target.parents):
                raise UsageError(f"--out {self.path} lies inside the run folders of the study in {folder} "
                                 f"({other.runs_dir}); a study needs a folder of its own: choose another --out")

    def __str__(self) -> str:
        return str(self.path)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` atomically unless it already holds exactly that; True if written."""
    if path.exists() and path.read_text() == text:
        return False
    write_text_atomically(path, text)
    return True


def _resolved(path: Path) -> Path:
    """``path`` with its links resolved, or made absolute where they cannot be (a loop of links)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()
