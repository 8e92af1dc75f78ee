"""A study folder's layout, named once (models/app/studies/folder.py): every path ``StudyFolder`` gives,
a run's folder, what lies inside the study's runs/, the study around a run folder (``plot``'s
title), and the places a study may not be started in."""
import json
import os

import pytest

from tinygrad_caps.models.app.studies.folder import StudyFolder, write_if_changed
from tinygrad_caps.models.app.training.run_folder import RunFolder
from tinygrad_caps.models.errors import UsageError


def test_every_file_of_the_layout_has_its_name(tmp_path):
    folder = StudyFolder(tmp_path / "study")
    assert folder == StudyFolder(str(tmp_path / "study")) and str(folder) == str(tmp_path / "study")
    names = {"plan_file": "study.json", "lock": "study.lock", "stop": "study.stop", "token": "study.token",
             "summary_json": "summary.json", "summary_md": "summary.md", "summary_png": "summary.png",
             "runs_dir": "runs"}
    for attribute, name in names.items():
        assert getattr(folder, attribute) == tmp_path / "study" / name, attribute
    assert not (tmp_path / "study").exists()  # (nothing is created)
    assert StudyFolder.of(folder) is folder and StudyFolder.of(tmp_path) == StudyFolder(tmp_path)


def test_a_run_is_a_run_folder_at_its_planned_path(tmp_path):
    folder = StudyFolder(tmp_path)
    run = folder.run("routing3-full", 2)
    assert isinstance(run, RunFolder) and run.path == tmp_path / "runs" / "routing3-full" / "seed-2"
    assert StudyFolder.run_path("routing3-full", 2) == "runs/routing3-full/seed-2"
    assert run.lock == run.path / "run.lock" and run.failed == run.path / "failed.json"
    assert run.train_log == run.path / "train.log"


def test_contains_is_runs_and_what_lies_in_it(tmp_path):
    folder = StudyFolder(tmp_path / "study")
    assert folder.contains(tmp_path / "study" / "runs")
    assert folder.contains(tmp_path / "study" / "runs" / "a" / "seed-0" / "checkpoints")
    assert not folder.contains(tmp_path / "study")
    assert not folder.contains(tmp_path / "study" / "summary.json")
    assert not folder.contains(tmp_path / "study" / "runsx")
    (tmp_path / "study" / "runs").mkdir(parents=True)
    os.symlink(tmp_path / "study" / "runs", tmp_path / "elsewhere")  # links are followed
    assert folder.contains(tmp_path / "elsewhere" / "a")


def test_around_finds_the_study_of_a_run_folder_only(tmp_path):
    study = StudyFolder(tmp_path / "study")
    run = study.run("routing1", 0).path
    run.mkdir(parents=True)
    assert StudyFolder.around(run) is None  # no study.json: no study
    study.plan_file.write_text("{}")
    assert StudyFolder.around(run) == StudyFolder(tmp_path / "study")
    assert study.holds_a_study()
    for other in (run / "checkpoints", tmp_path / "study", run.parent, tmp_path / "x" / "seed-0"):
        assert StudyFolder.around(other) is None, other


def test_a_study_is_refused_inside_a_training_run_or_another_study_s_runs(tmp_path):
    train_run = tmp_path / "train-run"
    (train_run / "checkpoints").mkdir(parents=True)
    (train_run / "config.json").write_text("{}")
    with pytest.raises(UsageError, match=f"--out {train_run} is the run folder of a training run"):
        StudyFolder(train_run).check_place()
    with pytest.raises(UsageError, match=f"lies inside {train_run}, which is the run folder of a training run"):
        StudyFolder(train_run / "study").check_place()
    other = StudyFolder(tmp_path / "other")
    other.runs_dir.mkdir(parents=True)
    other.plan_file.write_text("{}")
    with pytest.raises(UsageError, match=f"lies inside the run folders of the study in {other.path}"):
        StudyFolder(other.runs_dir / "mine").check_place()
    StudyFolder(tmp_path / "fresh").check_place()  # anywhere else: fine
    StudyFolder(other.path / "beside-runs").check_place()
    assert not (tmp_path / "fresh").exists()


def test_write_if_changed_leaves_a_file_that_holds_the_text(tmp_path):
    path = tmp_path / "summary.json"
    assert write_if_changed(path, json.dumps({"a": 1}))
    before = path.stat().st_mtime_ns
    assert not write_if_changed(path, json.dumps({"a": 1})) and path.stat().st_mtime_ns == before
    assert write_if_changed(path, "other") and path.read_text() == "other"
