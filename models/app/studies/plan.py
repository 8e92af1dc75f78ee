"""A study's plan as a frozen object: ``StudyPlan`` is DIR/study.json (what ``study run`` trains:
the study, its epochs and seeds, the options every run shares and, per configuration, its own
options and runs), read and checked field by field once, on load (``plan_file.check_plan``), and
written back with the bytes it had (``save``). Every module reads the plan through it
(``plan.configs``, ``plan.runs()``, ``plan.run_config(run)``), never by the file's keys.

``check_runs`` checks every configuration's first run as ``train`` checks a run before it reads
its data (its options, its dataset's files, its model, its routing, its CUDA graph, its memory),
without building a Trainer or reading an image.
"""
from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ...errors import UsageError
from ..training.reporting import is_user_error, one_line
from ..training.run_options import model_options, read_json_object
from .folder import StudyFolder, write_if_changed
from .plan_file import PlanError, check_plan, damaged_plan_message


@dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: its configuration, its seed, and its folder relative to the study's."""

    config_id: str
    seed: int
    path: str

    @property
    def label(self) -> str:
        """"<config_id> seed <seed>", as the study's lines name the run."""
        return f"{self.config_id} seed {self.seed}"


@dataclass(frozen=True)
class PlannedConfig:
    """A configuration of the plan: its id, its own options (those the study varies) and its runs."""

    config_id: str
    options: Mapping
    runs: tuple

    def __post_init__(self):
        object.__setattr__(self, "options", _frozen(self.options))
        object.__setattr__(self, "runs", tuple(self.runs))


@dataclass(frozen=True, kw_only=True)
class StudyPlan:
    """DIR/study.json as a frozen object, checked field by field once, on load (the module docstring)."""

    study: str
    varies: str | None = None
    command: str | None = None
    version: str | None = None
    epochs: int
    seeds: tuple
    parameters: Mapping = field(default_factory=dict)
    options: Mapping
    configs: tuple
    tensorboard_out: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "parameters", _frozen(self.parameters))
        object.__setattr__(self, "options", _frozen(self.options))
        object.__setattr__(self, "configs", tuple(self.configs))

    @classmethod
    def load(cls, folder) -> "StudyPlan | None":
        """The plan in ``folder`` (a StudyFolder or its path); None where it holds no study.json; a
        UsageError naming the file (and the field) where it cannot be read or a field is damaged."""
        path = StudyFolder.of(folder).plan_file
        record = read_json_object(path, f"cannot read {path}",
                                  f"{path} is not a study's plan (study, options, seeds, epochs, configs)")
        if record is None:
            return None
        try:
            return cls.from_json(record)
        except PlanError as exc:
            raise UsageError(damaged_plan_message(path, exc)) from None

    @classmethod
    def from_json(cls, record: dict) -> "StudyPlan":
        """The plan of a study.json object; PlanError naming its first damaged field."""
        check_plan(record)
        configs = tuple(PlannedConfig(entry.get("config_id"), entry.get("options"),
                                      tuple(PlannedRun(entry.get("config_id"), run.get("seed"), run.get("path"))
                                            for run in entry.get("runs")))
                        for entry in record.get("configs"))
        return cls(study=record.get("study"), varies=record.get("varies"), command=record.get("command"),
                   version=record.get("version"), epochs=record.get("epochs"), seeds=record.get("seeds"),
                   parameters=record.get("parameters", {}), options=record.get("options"), configs=configs,
                   tensorboard_out=record.get("tensorboard_out"))

    def to_json(self) -> dict:
        """The study.json object: study, varies, command, version, epochs, seeds, parameters, options,
        configs (config_id, options, runs: seed, path), then tensorboard_out only where it is set
        (an older study's study.json keeps its bytes); an unset varies, command or version is left out."""
        record = {"study": self.study, "varies": self.varies, "command": self.command, "version": self.version}
        record = {key: value for key, value in record.items() if value is not None or key == "study"}
        record.update(epochs=self.epochs, seeds=list(self.seeds), parameters=_plain(self.parameters),
                      options=_plain(self.options),
                      configs=[{"config_id": config.config_id, "options": _plain(config.options),
                                "runs": [{"seed": run.seed, "path": run.path} for run in config.runs]}
                               for config in self.configs])
        if self.tensorboard_out is not None:
            record["tensorboard_out"] = self.tensorboard_out
        return record

    def save(self, folder) -> bool:
        """Write DIR/study.json (creating DIR) unless it holds this plan already; True if written."""
        folder = StudyFolder.of(folder)
        folder.path.mkdir(parents=True, exist_ok=True)
        return write_if_changed(folder.plan_file, json.dumps(self.to_json(), indent=2) + "\n")

    def runs(self) -> list:
        """Every run of the plan as a PlannedRun, in the plan's order (configurations, then seeds)."""
        return [run for config in self.configs for run in config.runs]

    def config(self, config_id: str) -> PlannedConfig:
        """The configuration ``config_id``; KeyError naming it where the plan has none."""
        for config in self.configs:
            if config.config_id == config_id:
                return config
        raise KeyError(f"the study {self.study} has no configuration {config_id!r}")

    def find_run(self, config_id: str, seed: int) -> PlannedRun | None:
        """The run ``config_id``/``seed`` of the plan, or None where it plans none."""
        for config in self.configs:
            if config.config_id == config_id:
                return next((run for run in config.runs if run.seed == seed), None)
        return None

    def run_config(self, run: PlannedRun):
        """The TrainingConfig one run trains with: the study's shared options, its configuration's
        own, the plan's epochs and the run's seed, with only the chosen model's options (as
        ``train`` records them); a UsageError naming the option where they do not go together."""
        from ..training.trainer import training_config  # (the trainer's imports only where a run is set up)

        options = {"model": "capsnet", **_plain(self.options)}  # a study may train another model for all its runs
        options.update(_plain(self.config(run.config_id).options), epochs=self.epochs, seed=run.seed)
        if options.get("augment") == "none":
            options["augment"] = None
        return training_config(model_options(options, explicit=set()))

    def check_runs(self) -> None:
        """Check the first run of every configuration as ``train`` checks a run before reading its
        data (``training.preflight.preflight``): no Trainer is built and no image read. A refusal is
        a UsageError naming the configuration: "configuration X: ..."."""
        from ..training.preflight import preflight

        for config in self.configs:
            try:
                preflight(self.run_config(config.runs[0]))
            except Exception as exc:  # noqa: BLE001  (a user's mistake gets the configuration's name; a bug passes)
                if not is_user_error(exc):
                    raise
                raise UsageError(f"configuration {config.config_id}: {one_line(exc)}") from exc

    def continue_command(self, folder, scheduling=()) -> str:
        """The command that continues the study in ``folder`` (as given on the command line, or a
        StudyFolder): its --tensorboard-out, then the words of the scheduling options it was started
        with (``scheduling``: ``["--jobs", "2", ...]``) repeated, so that every run continues with the
        thread count it started with."""
        words = ["tinygrad-caps", "study", "run", self.study, "--out", str(folder), "--resume"]
        if self.tensorboard_out is not None:
            words += ["--tensorboard-out", self.tensorboard_out]
        return shlex.join([*words, *scheduling])


def _frozen(mapping) -> Mapping:
    """A read-only copy of ``mapping`` (its values copied too: the plan never shares a list)."""
    return MappingProxyType(copy.deepcopy(dict(mapping)))


def _plain(mapping) -> dict:
    """A dict copy of a plan's mapping, as JSON holds it."""
    return copy.deepcopy(dict(mapping))
