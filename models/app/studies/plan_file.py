"""The checks of a study's plan file, DIR/study.json, field by field: ``plan.StudyPlan.load`` (the one
loader, for ``study run --resume``, ``study summary``, the executors' runs and ``plot``) applies
``check_plan`` to what it reads, so a damaged plan is one UsageError naming the file and the field
(``configs[1].runs[0].path``), never a traceback later and never a summary of something else. The fields:

    study       the study's name (a non-empty string)
    epochs      a positive integer (not a boolean, not a number with a fraction, not NaN)
    seeds       a non-empty list of distinct integers in [0, 2**63)
    options     the options every run shares (an object)
    configs     a non-empty list of {"config_id", "options" (an object), "runs": a non-empty list of
                {"seed": one of seeds, "path": a relative path inside the study folder}}, every
                config_id and every run (its path, and its seed within its configuration) listed once
    parameters  (optional) an object; command, varies, version, tensorboard_out: (optional) strings
"""
from __future__ import annotations

import numbers
from pathlib import PurePosixPath

REQUIRED_FIELDS = ("study", "options", "seeds", "epochs", "configs")
OPTIONAL_TEXT_FIELDS = ("command", "varies", "version", "tensorboard_out")
SEED_LIMIT = 2 ** 63


class PlanError(Exception):
    """A damaged field of a plan: ``field`` names it, ``problem`` says what is wrong with it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


def damaged_plan_message(path, exc: PlanError) -> str:
    """The one-line refusal of the plan file ``path`` whose field ``exc`` names is damaged."""
    return (f"{path}: field {exc}; the study's plan is damaged (restore study.json, or start the study afresh "
            "in another --out)")


def check_plan(record: dict) -> None:
    """Raise PlanError for the first damaged field of ``record``, a plan file's JSON object (see the
    module docstring)."""
    for name in REQUIRED_FIELDS:
        if name not in record:
            raise PlanError(name, "is missing")
    study = record.get("study")
    if not isinstance(study, str) or not study:
        raise PlanError("study", f"must be the study's name, got {_shown(study)}")
    _check_positive_integer("epochs", record.get("epochs"))
    seeds = _checked_seeds(record.get("seeds"))
    _check_object("options", record.get("options"))
    if "parameters" in record:
        _check_object("parameters", record.get("parameters"))
    for name in OPTIONAL_TEXT_FIELDS:
        value = record.get(name)
        if value is not None and not isinstance(value, str):
            raise PlanError(name, f"must be a string, got {_shown(value)}")
    _check_configs(record.get("configs"), set(seeds))


def _check_configs(configs, seeds: set) -> None:
    """Every configuration and run of the plan (each listed once)."""
    if not isinstance(configs, list) or not configs:
        raise PlanError("configs", f"must be a non-empty list of configurations, got {_shown(configs)}")
    ids, paths = set(), set()
    for k, entry in enumerate(configs):
        where = f"configs[{k}]"
        if not isinstance(entry, dict):
            raise PlanError(where, f"must be an object with config_id, options and runs, got {_shown(entry)}")
        for name in ("config_id", "options", "runs"):
            if name not in entry:
                raise PlanError(f"{where}.{name}", "is missing")
        config_id = entry.get("config_id")
        if not isinstance(config_id, str) or not config_id:
            raise PlanError(f"{where}.config_id", f"must be a non-empty string, got {_shown(config_id)}")
        if config_id in ids:
            raise PlanError(f"{where}.config_id", f"{config_id!r} is listed twice")
        ids.add(config_id)
        _check_object(f"{where}.options", entry.get("options"))
        _check_runs(where, entry.get("runs"), seeds, paths)


def _check_runs(where: str, runs, seeds: set, paths: set) -> None:
    """A configuration's runs: each a seed of the plan and a path inside the study folder, listed once."""
    if not isinstance(runs, list) or not runs:
        raise PlanError(f"{where}.runs", f"must be a non-empty list of runs, got {_shown(runs)}")
    run_seeds = set()
    for k, entry in enumerate(runs):
        at = f"{where}.runs[{k}]"
        if not isinstance(entry, dict):
            raise PlanError(at, f"must be an object with seed and path, got {_shown(entry)}")
        for name in ("seed", "path"):
            if name not in entry:
                raise PlanError(f"{at}.{name}", "is missing")
        seed = entry.get("seed")
        if not _is_integer(seed) or seed not in seeds:
            raise PlanError(f"{at}.seed", f"must be one of the plan's seeds, got {_shown(seed)}")
        if seed in run_seeds:
            raise PlanError(f"{at}.seed", f"{seed}: the run is listed twice")
        run_seeds.add(seed)
        path = entry.get("path")
        if not _inside(path):
            raise PlanError(f"{at}.path", f"must be a relative path inside the study folder, got {_shown(path)}")
        normal = PurePosixPath(path).as_posix()
        if normal in paths:
            raise PlanError(f"{at}.path", f"{path}: the run is listed twice")
        paths.add(normal)


def _inside(path) -> bool:
    """Whether ``path`` is a non-empty relative path that stays inside the study folder."""
    return isinstance(path, str) and bool(path) and not PurePosixPath(path).is_absolute() \
        and ".." not in PurePosixPath(path).parts


def _checked_seeds(seeds) -> list:
    """The plan's seeds: a non-empty list of distinct integers in [0, 2**63)."""
    wanted = f"must be a non-empty list of distinct integers in [0, 2**63), got {_shown(seeds)}"
    if not isinstance(seeds, list) or not seeds:
        raise PlanError("seeds", wanted)
    for seed in seeds:
        if not _is_integer(seed) or not 0 <= seed < SEED_LIMIT:
            raise PlanError("seeds", f"must hold integers in [0, 2**63), got {_shown(seed)}")
    if len(set(seeds)) != len(seeds):
        duplicated = next(s for s in seeds if seeds.count(s) > 1)
        raise PlanError("seeds", f"lists the seed {duplicated} twice")
    return seeds


def _check_positive_integer(name: str, value) -> None:
    """PlanError unless ``value`` is an integer >= 1."""
    if not _is_integer(value) or value < 1:
        raise PlanError(name, f"must be a positive integer, got {_shown(value)}")


def _check_object(name: str, value) -> None:
    """PlanError unless ``value`` is a JSON object."""
    if not isinstance(value, dict):
        raise PlanError(name, f"must be an object, got {_shown(value)}")


def _is_integer(value) -> bool:
    """An integer, not a boolean (JSON's true is not 1 here), not a float such as 2.0 or NaN."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _shown(value) -> str:
    """A value as a message shows it: its JSON type and, where short, the value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    kind = {str: "the string", int: "the integer", float: "the number", list: "the list",
            dict: "the object"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text}" if len(text) <= 40 else kind
