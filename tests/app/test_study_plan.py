"""A study's plan as a frozen object (models/app/studies/plan.py): study.json loaded and checked field
by field once (every damaged field is one line naming the file and the field), saved back with the
bytes it had, its runs in order, a run's TrainingConfig; the checks of every configuration's first
run before anything is written, made without a Trainer and without reading an image (every
registered study passes them on the tiny data); and no module of the application reads a plan by
its keys."""
import dataclasses
import json
import re

import pytest

from cli_helpers import TINY, tiny_data_dir
from paths import ROOT
from tinygrad_caps.data.registry import DatasetSpec
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.cli import study as study_command
from tinygrad_caps.models.app.studies.folder import StudyFolder
from tinygrad_caps.models.app.studies.plan import PlannedConfig, PlannedRun, StudyPlan
from tinygrad_caps.models.app.studies.registry import STUDIES
from tinygrad_caps.models.app.training import trainer as training
from tinygrad_caps.models.app.training.config import TrainingConfig
from tinygrad_caps.models.errors import UsageError


def plan_record(**changes):
    """A study.json object as ``study run`` writes it (key order included), with ``changes``."""
    runs = lambda config_id: [{"seed": s, "path": f"runs/{config_id}/seed-{s}"} for s in (0, 3)]  # noqa: E731
    record = {"study": "gradient-modes", "varies": "the routing gradient", "command": "tinygrad-caps study run x",
              "version": "0.1.0", "epochs": 2, "seeds": [0, 3], "parameters": {},
              "options": {"conv1_channels": 4, "cnn_channels": [2, 2, 2], "augment": None, "log_mode_cosine": True},
              "configs": [{"config_id": "routing1", "options": {"routing_iterations": 1}, "runs": runs("routing1")},
                          {"config_id": "routing3-detach", "options": {"routing_iterations": 3,
                                                                       "routing_gradient": "detach"},
                           "runs": runs("routing3-detach")}]}
    record.update(changes)
    return record


def write_plan(folder, record):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.json").write_text(json.dumps(record, indent=2) + "\n")
    return folder / "study.json"


@pytest.mark.parametrize("changes", [{}, {"tensorboard_out": "tb dir"}, {"parameters": {"max_depth": 2}}])
def test_a_saved_plan_is_written_back_with_the_bytes_it_had(tmp_path, changes):
    path = write_plan(tmp_path / "a", plan_record(**changes))
    plan = StudyPlan.load(tmp_path / "a")
    assert not plan.save(StudyFolder(tmp_path / "a"))  # it holds the plan already: not written
    assert plan.save(tmp_path / "b") and (tmp_path / "b" / "study.json").read_bytes() == path.read_bytes()
    assert StudyPlan.load(tmp_path / "b") == plan
    assert plan.to_json() == plan_record(**changes)


def test_an_older_plan_without_its_optional_fields_keeps_its_bytes(tmp_path):
    record = {k: v for k, v in plan_record().items() if k not in ("varies", "command", "version")}
    path = write_plan(tmp_path / "a", record)
    plan = StudyPlan.load(tmp_path / "a")
    assert plan.varies is None and plan.command is None and plan.version is None
    assert plan.save(tmp_path / "b") and (tmp_path / "b" / "study.json").read_bytes() == path.read_bytes()


def test_a_plan_is_frozen_and_shares_nothing_it_was_given(tmp_path):
    record = plan_record()
    plan = StudyPlan.from_json(record)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.epochs = 3
    with pytest.raises(TypeError):
        plan.options["lr"] = 0.1
    with pytest.raises(TypeError):
        plan.configs[0].options["routing_iterations"] = 2
    record["options"]["cnn_channels"].append(9)
    assert plan.options["cnn_channels"] == [2, 2, 2]
    plan.to_json()["options"]["cnn_channels"].append(9)
    assert plan.options["cnn_channels"] == [2, 2, 2]


def test_the_runs_come_in_plan_order_with_their_labels_and_folders(tmp_path):
    plan = StudyPlan.from_json(plan_record())
    assert [(r.config_id, r.seed, r.path) for r in plan.runs()] == [
        ("routing1", 0, "runs/routing1/seed-0"), ("routing1", 3, "runs/routing1/seed-3"),
        ("routing3-detach", 0, "runs/routing3-detach/seed-0"), ("routing3-detach", 3, "runs/routing3-detach/seed-3")]
    assert plan.runs()[1].label == "routing1 seed 3"
    assert plan.config("routing3-detach").options == {"routing_iterations": 3, "routing_gradient": "detach"}
    with pytest.raises(KeyError, match="no configuration 'routing2'"):
        plan.config("routing2")
    assert plan.find_run("routing1", 3) == plan.runs()[1] and plan.find_run("routing1", 1) is None
    assert all(StudyFolder(tmp_path).run(r.config_id, r.seed).path == tmp_path / r.path for r in plan.runs())


def test_a_run_s_config_is_a_training_config_of_the_shared_and_its_own_options():
    plan = StudyPlan.from_json(plan_record())
    config = plan.run_config(plan.runs()[3])
    assert isinstance(config, TrainingConfig)
    assert (config.model, config.epochs, config.seed, config.augment, config.log_mode_cosine) == (
        "capsnet", 2, 3, "none", True)
    assert config.network["conv1_channels"] == 4 and config.network["routing_iterations"] == 3
    assert config.network["routing_gradient"] == "detach" and "cnn_channels" not in config.network
    cnn = StudyPlan.from_json(plan_record(options={"model": "cnn", "cnn_channels": [2, 2, 2]},
                                          configs=[{"config_id": "small", "options": {"cnn_hidden": [4, 4]},
                                                    "runs": [{"seed": 0, "path": "runs/small/seed-0"}]}]))
    config = cnn.run_config(cnn.runs()[0])
    assert config.model == "cnn" and config.network["cnn_hidden"] == [4, 4]
    bad = StudyPlan.from_json(plan_record(options={"lr": 5}))
    with pytest.raises(UsageError, match=r"--lr must lie in \(0, 1\], got 5"):
        bad.run_config(bad.runs()[0])


def test_continue_command_repeats_the_folder_as_given_and_the_tensorboard_export():
    plan = StudyPlan.from_json(plan_record(tensorboard_out="tb"))
    assert plan.continue_command("runs/x y") == ("tinygrad-caps study run gradient-modes --out 'runs/x y' --resume "
                                                 "--tensorboard-out tb")
    assert plan.continue_command(StudyFolder("s"), ["--jobs", "2"]).endswith("--out s --resume --tensorboard-out tb "
                                                                             "--jobs 2")


def _damages(record):
    """(change, message) of every field check of plan_file.check_plan."""
    config, run = record["configs"][0], record["configs"][0]["runs"][0]
    one = lambda **c: [dict(config, **c)]  # noqa: E731
    return [
        ({"study": None}, "field study is missing"),
        ({"study": ""}, "field study must be the study's name, got the string ''"),
        ({"epochs": 1.5}, "field epochs must be a positive integer, got the number 1.5"),
        ({"seeds": []}, "field seeds must be a non-empty list of distinct integers in [0, 2**63), got the list []"),
        ({"seeds": [0, -1]}, "field seeds must hold integers in [0, 2**63), got the integer -1"),
        ({"seeds": [0, 2 ** 63]}, "field seeds must hold integers in [0, 2**63), got the integer 9223372036854775808"),
        ({"seeds": [0, 0]}, "field seeds lists the seed 0 twice"),
        ({"options": []}, "field options must be an object, got the list []"),
        ({"parameters": "x"}, "field parameters must be an object, got the string 'x'"),
        ({"varies": 3}, "field varies must be a string, got the integer 3"),
        ({"tensorboard_out": True}, "field tensorboard_out must be a string, got true"),
        ({"configs": {}}, "field configs must be a non-empty list of configurations, got the object {}"),
        ({"configs": ["x"]}, "field configs[0] must be an object with config_id, options and runs, got the string 'x'"),
        ({"configs": [{k: v for k, v in config.items() if k != "options"}]}, "field configs[0].options is missing"),
        ({"configs": one(config_id=7)}, "field configs[0].config_id must be a non-empty string, got the integer 7"),
        ({"configs": [config, dict(config, runs=[dict(run, path="runs/other")])]},
         "field configs[1].config_id 'routing1' is listed twice"),
        ({"configs": one(options=None)}, "field configs[0].options must be an object, got null"),
        ({"configs": one(runs=[])}, "field configs[0].runs must be a non-empty list of runs, got the list []"),
        ({"configs": one(runs=[3])}, "field configs[0].runs[0] must be an object with seed and path, got the integer 3"),
        ({"configs": one(runs=[{"path": "p"}])}, "field configs[0].runs[0].seed is missing"),
        ({"configs": one(runs=[dict(run, seed=1)])}, "field configs[0].runs[0].seed must be one of the plan's seeds, "
                                                     "got the integer 1"),
        ({"configs": one(runs=[run, dict(run, path="other")])}, "field configs[0].runs[1].seed 0: the run is listed twice"),
        ({"configs": one(runs=[dict(run, path="/abs")])}, "field configs[0].runs[0].path must be a relative path inside "
                                                          "the study folder, got the string '/abs'"),
        ({"configs": one(runs=[dict(run, path="../x")])}, "field configs[0].runs[0].path must be a relative path "
                                                          "inside the study folder, got the string '../x'"),
        ({"configs": one(runs=[run, dict(run, seed=3)])}, "field configs[0].runs[1].path runs/routing1/seed-0: the run "
                                                          "is listed twice"),
    ]


@pytest.mark.parametrize("index", range(len(_damages(plan_record()))))
def test_every_damaged_field_is_one_line_naming_the_file_and_the_field(tmp_path, index):
    change, message = _damages(plan_record())[index]
    record = {k: v for k, v in plan_record(**change).items() if v is not None or k not in change}
    path = write_plan(tmp_path, record)
    with pytest.raises(UsageError) as refused:
        StudyPlan.load(tmp_path)
    text = str(refused.value)
    assert text == f"{path}: {message}; the study's plan is damaged (restore study.json, or start the study afresh " \
                   "in another --out)", text


def test_a_folder_without_a_plan_has_none_and_an_unreadable_one_is_refused(tmp_path):
    assert StudyPlan.load(tmp_path) is None
    (tmp_path / "study.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="is not a study's plan"):
        StudyPlan.load(tmp_path)
    (tmp_path / "study.json").write_text("{")
    with pytest.raises(UsageError, match="cannot read"):
        StudyPlan.load(tmp_path)


# --- the checks before anything is written: no Trainer, no image ---

@pytest.fixture
def no_trainer_no_images(monkeypatch):
    """A Trainer that cannot be built and a dataset that cannot be loaded: a check that needs either fails."""
    def refuse(*args, **kwargs):
        raise AssertionError("the plan's checks built a Trainer or read the data")

    monkeypatch.setattr(training.Trainer, "__init__", refuse)
    monkeypatch.setattr(DatasetSpec, "load", refuse)


@pytest.fixture
def nothing_written(monkeypatch):
    """``study run`` ends with a UsageError right after its checks (the executor is the next step)."""
    def checked(*args, **kwargs):
        raise UsageError("checked: nothing written")

    monkeypatch.setattr(study_command, "executor_for", checked)


def study_data(tmp_path):
    return ["--dataset", "tiny", "--data-dir", str(tiny_data_dir(tmp_path / "data", (24, 12), compress=False))]


@pytest.mark.parametrize("name, extra, message", [
    ("conventions", ["--routing", "em"], "configuration official-full: routing 'em' takes no capsule bias"),
    ("depth", ["--routing", "em", "--max-depth", "1"], "configuration ours-depth0-bias: routing 'em' takes no capsule"),
    ("gradient-modes", ["--routing", "self-attention"],
     "configuration routing1: --log-mode-cosine: routing 'self-attention' is not iterative; it has one gradient mode, "
     "so there is no other mode to compare with"),
    ("conventions", ["--device", "cpu", "--cuda-graph", "on"],
     "configuration paper-full: --cuda-graph on: the training step cannot be captured: CUDA graphs need a GPU"),
    ("conventions", ["--dataset", "no-such-data"], "configuration paper-full: dataset 'no-such-data' not found"),
    ("conventions", ["--data-dir", "MISSING"], "configuration paper-full: dataset 'tiny' not found"),
    ("conventions", ["--dataset", "mnist", "--data-dir", "MISSING"],
     "configuration paper-full: dataset 'mnist' not found (downloads are off)"),
    ("conventions", ["--kernel-size", "9"], "configuration paper-full: 10x10 images are too small for two 9x9 "
                                            "convolutions"),
    ("conventions", ["--conv1-channels", "1000000000"], "configuration paper-full: this model cannot fit"),
])
def test_each_configuration_is_checked_without_a_trainer_or_its_images(tmp_path, capsys, no_trainer_no_images, name,
                                                                       extra, message):
    extra = [str(tmp_path / "missing") if word == "MISSING" else word for word in extra]
    out = tmp_path / "refused"
    assert cli.main(["study", "run", name, "--out", str(out), *study_data(tmp_path), *TINY, "--seed-list", "0",
                     *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_registered_study_passes_its_checks_without_a_trainer_or_images(tmp_path, capsys, name,
                                                                              no_trainer_no_images, nothing_written):
    out = tmp_path / "study"
    extra = ["--max-depth", "1"] if name == "depth" else []
    cnn = ["--cnn-channels", "2,2,2", "--cnn-hidden", "4,4"] if name == "routing-ablation" else []
    assert cli.main(["study", "run", name, "--out", str(out), *study_data(tmp_path), *TINY, *cnn, *extra]) == 2
    assert capsys.readouterr().err.strip().endswith("checked: nothing written")
    assert not out.exists()


def test_the_checks_refuse_what_a_run_s_trainer_refuses_on_the_same_config(tmp_path):
    """check_runs against the Trainer: the same refusal for a config both meet (the spread loss captured)."""
    from tinygrad_caps.models.app.training.preflight import preflight

    data = tiny_data_dir(tmp_path / "data", (24, 12), compress=False)
    config = TrainingConfig.from_dict({"dataset": "tiny", "data_dir": str(data), "device": "cpu",
                                       "cuda_graph": "on", "conv1_channels": 4, "primary_types": 2,
                                       "primary_dim": 4, "digit_dim": 4, "kernel_size": 3})
    with pytest.raises(UsageError) as checked:
        preflight(config)
    with pytest.raises(UsageError) as trained:
        training.Trainer(config, tmp_path / "run", show_progress=False, log=lambda text: None)
    assert str(checked.value) == str(trained.value)


# --- no module reads a plan by its keys ---

PLAN_READS = re.compile(r"""plan\[|config\[["']runs["']\]|run\[["'](seed|path)["']\]""")


def test_no_module_of_the_application_reads_a_plan_by_its_keys():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "models" / "app").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if PLAN_READS.search(line)]
    assert found == []


def test_the_key_check_sees_a_read():
    assert PLAN_READS.search('epochs = plan["epochs"]') and PLAN_READS.search("for run in config['runs']:")
    assert PLAN_READS.search('out / run["path"]') and not PLAN_READS.search("plan.runs()")


def test_the_planned_objects_hold_their_runs_as_tuples():
    run = PlannedRun("a", 0, "runs/a/seed-0")
    config = PlannedConfig("a", {"x": 1}, [run])
    plan = StudyPlan(study="s", epochs=1, seeds=[0], options={}, configs=[config])
    assert plan.configs == (config,) and config.runs == (run,) and plan.seeds == (0,)
    assert hash(run) == hash(PlannedRun("a", 0, "runs/a/seed-0"))  # (a run is a key of the executors' tables)
