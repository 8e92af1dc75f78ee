"""``tinygrad-caps study list | run | summary`` end to end on a tiny IDX dataset and tiny models: the
study's folder (study.json, run folders that evaluate and plot read), the summary's arithmetic
against the run folders' own metrics and gradient-flow logs, resume (a finished study is left
byte for byte as it was; one stopped by --max-minutes ends with the metrics of one never stopped),
the registry from Python, and the refusals."""
import json
import math
import time
import types
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import TINY, tiny_data_dir
from helpers import metrics_without_times
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.cli import study as study_command
from tinygrad_caps.models.app.studies import driver as study_driver, registry as study_registry
from tinygrad_caps.models.app.training import trainer as training
from tinygrad_caps.models.app.studies.registry import STUDIES, register_study
from tinygrad_caps.models.analysis.figures import line_values

T975_DF1 = 12.7062047362  # Student's t, 97.5% quantile, one degree of freedom


def study_data(root):
    """The dataset options of a study here: "tiny" in ``root``, 24 training and 12 test images, uncompressed."""
    return ["--dataset", "tiny", "--data-dir", str(tiny_data_dir(root, (24, 12), compress=False))]


@pytest.fixture
def data(tmp_path):
    return study_data(tmp_path / "data")


def study(name, out, data, *extra):
    return cli.main(["study", "run", name, "--out", str(out), *data, *TINY, *extra])


def read_json(path):
    return json.loads(path.read_text())


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def snapshot(folder):
    """{path: (bytes, mtime)} of every file below ``folder``."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_study_list_shows_every_registered_study_with_what_it_varies_and_its_budget(capsys):
    assert cli.main(["study", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(STUDIES)
    built_in = {"routing-ablation", "gradient-modes", "depth", "conventions", "routing-algorithms", "recipe-ablation",
                "paper-accuracy"}
    assert set(STUDIES) >= built_in
    for line in lines:  # (the documents' examples may have registered studies of other budgets)
        assert "configuration" in line
        assert line.split()[0] not in built_in - {"paper-accuracy"} or "default 5 epochs x 3 seeds" in line
    assert "16 configurations" in next(line for line in lines if line.startswith("depth"))
    assert "default 30 epochs x 3 seeds, 1 configuration" in next(l for l in lines if l.startswith("paper-accuracy"))


def test_a_study_runs_summarises_its_run_folders_and_resumes_as_a_no_op(tmp_path, data, capsys):
    out = tmp_path / "modes"
    assert study("gradient-modes", out, data, "--seeds", "2", "--epochs", "2", "--log-gradflow", "1") == 0
    plan = read_json(out / "study.json")
    assert plan["study"] == "gradient-modes" and plan["epochs"] == 2 and plan["seeds"] == [0, 1]
    assert plan["command"].startswith("tinygrad-caps study run gradient-modes --out ") and plan["version"]
    assert [c["config_id"] for c in plan["configs"]] == ["routing1", "routing3-full", "routing3-detach"]
    assert plan["configs"][2]["options"] == {"routing_iterations": 3, "routing_gradient": "detach"}
    assert plan["options"]["conv1_channels"] == 4 and plan["options"]["log_mode_cosine"] is True
    assert "routing_iterations" not in plan["options"] and "epochs" not in plan["options"]

    summary = read_json(out / "summary.json")
    assert summary["study"] == "gradient-modes" and summary["metric"] == "test_accuracy" and summary["complete"]
    for config, row in zip(plan["configs"], summary["rows"]):
        assert row["config_id"] == config["config_id"] and row["config"] == config["options"]
        runs = [out / run["path"] for run in config["runs"]]
        assert [r.name for r in runs] == ["seed-0", "seed-1"]
        finals = [read_lines(r / "metrics.jsonl")[-1] for r in runs]
        values = [f["test_accuracy"] for f in finals]
        assert row["values"] == values and row["n"] == 2 and row["seeds"] == [0, 1]
        assert row["mean"] == pytest.approx(np.mean(values)) and row["std"] == pytest.approx(np.std(values, ddof=1))
        half = T975_DF1 * np.std(values, ddof=1) / math.sqrt(2)
        assert row["ci95"] == pytest.approx([np.mean(values) - half, np.mean(values) + half])
        for name in ("train_loss", "test_loss"):
            losses = [f[name] for f in finals]
            assert row["metrics"][name]["mean"] == pytest.approx(np.mean(losses))
            assert row["metrics"][name]["std"] == pytest.approx(np.std(losses, ddof=1))
        shares, cosines = [], []
        for r in runs:
            config_json = read_json(r / "config.json")
            assert config_json["routing_iterations"] == config["options"]["routing_iterations"]
            last_epoch = [line for line in read_lines(r / "gradflow.jsonl") if line["epoch"] == 2]
            digit = [line["layers"][-1]["iterations"] for line in last_epoch]
            norms = [[(i["grad_norm_sum"] or 0) + (i["grad_norm_agreement"] or 0) for i in rows] for rows in digit]
            shares.append(np.mean([sum(n[:-1]) / sum(n) for n in norms]) if len(norms[0]) > 1 else None)
            cosines.append(np.mean([line["mode_cosine"]["all"] for line in last_epoch]))
        inner = row["metrics"]["inner_share"]
        if config["config_id"] == "routing1":
            assert inner["mean"] is None and row["metrics"]["mode_cosine"]["mean"] == pytest.approx(1.0)
        else:
            assert inner["mean"] == pytest.approx(np.mean(shares)) and inner["std"] == pytest.approx(np.std(shares, ddof=1))
        if config["config_id"] == "routing3-detach":
            assert inner["mean"] == 0.0
        assert row["metrics"]["mode_cosine"]["mean"] == pytest.approx(np.mean(cosines))
    assert [(c["from"], c["to"], c["option"]) for c in summary["comparisons"]] == [
        ("routing1", "routing3-full", "routing_iterations"), ("routing3-full", "routing3-detach", "routing_gradient")]
    rows = {row["config_id"]: row for row in summary["rows"]}
    for comparison in summary["comparisons"]:
        first, second = rows[comparison["from"]], rows[comparison["to"]]
        assert comparison["difference"] == pytest.approx(second["mean"] - first["mean"])
        se = math.sqrt(first["std"] ** 2 / 2 + second["std"] ** 2 / 2)
        if se > 0:  # Welch: the degrees of freedom of two samples of two lie between 1 and 2
            half = (comparison["ci95"][1] - comparison["ci95"][0]) / 2
            assert 4.30 * se <= half + 1e-12 and half <= T975_DF1 * se + 1e-12
        differences = np.array(second["values"]) - np.array(first["values"])
        paired = comparison["paired"]
        assert paired["mean"] == pytest.approx(differences.mean()) and paired["n"] == 2
        assert paired["std"] == pytest.approx(np.std(differences, ddof=1), abs=1e-15)
        half = T975_DF1 * np.std(differences, ddof=1) / math.sqrt(2)
        assert paired["ci95"] == pytest.approx([differences.mean() - half, differences.mean() + half], abs=1e-12)
    markdown = (out / "summary.md").read_text()
    assert "| routing3-detach | routing_iterations=3, routing_gradient=\"detach\" | 2 |" in markdown
    if (out / "summary.png").exists() or _has_matplotlib():
        assert (out / "summary.png").read_bytes()[:4] == b"\x89PNG"

    run = out / "runs" / "routing3-full" / "seed-1"  # an ordinary run folder
    assert cli.main(["evaluate", "--checkpoint", str(run / "checkpoints" / "best.npz"), *data]) == 0
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "curves.png")]) == 0

    before = snapshot(out)
    capsys.readouterr()
    assert cli.main(["study", "run", "gradient-modes", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert "training" not in capsys.readouterr().out
    assert snapshot(out) == before
    assert cli.main(["study", "summary", str(out)]) == 0 and snapshot(out) == before
    assert study("gradient-modes", out, data, "--seeds", "2", "--epochs", "2") == 2
    assert "holds a study already" in capsys.readouterr().err


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_max_minutes_stops_at_a_batch_boundary_and_resume_ends_as_an_unstopped_study(tmp_path, data, capsys,
                                                                                      monkeypatch):
    common = ("--seeds", "1", "--epochs", "2", "--seed-list", "5")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert study("conventions", whole, data, *common[2:]) == 0
    clock = iter(range(10 ** 9))  # one second per reading of the study's and the trainer's clock
    fake_time = types.SimpleNamespace(monotonic=lambda: float(next(clock)), perf_counter=time.perf_counter)
    for module in (study_command, study_driver, training):
        monkeypatch.setattr(module, "time", fake_time)
    assert study("conventions", cut, data, *common[2:], "--max-minutes", "0.25") == 75  # 15 readings: mid run 2
    printed = capsys.readouterr()
    assert f"continue with: tinygrad-caps study run conventions --out {cut} --resume" in printed.out
    assert "time limit reached: saved" in printed.err
    monkeypatch.undo()
    plan = read_json(cut / "study.json")
    partial = read_json(cut / "summary.json")
    assert not partial["complete"] and 0 < partial["runs_finished"] < 4
    stopped = cut / plan["configs"][partial["runs_finished"]]["runs"][0]["path"]
    assert (stopped / "checkpoints" / "last.npz").exists()  # saved where it stopped, mid-run
    assert cli.main(["study", "run", "conventions", "--out", str(cut), "--resume", "--no-progress"]) == 0
    assert read_json(cut / "summary.json")["complete"]
    for config in plan["configs"]:
        (run,) = config["runs"]
        assert run["path"].endswith("/seed-5")
        assert metrics_without_times(cut / run["path"]) == metrics_without_times(whole / run["path"])
    whole_rows = read_json(whole / "summary.json")["rows"]
    assert [r["values"] for r in read_json(cut / "summary.json")["rows"]] == [r["values"] for r in whole_rows]
    assert all(r["std"] is None and r["ci95"] is None for r in whole_rows)  # one seed: no spread


def test_resume_adds_seeds_and_epochs_and_refuses_a_changed_option(tmp_path, data, capsys):
    out = tmp_path / "conventions"
    assert study("conventions", out, data, "--seeds", "1", "--epochs", "1") == 0
    assert cli.main(["study", "run", "conventions", "--out", str(out), "--resume", "--seeds", "2", "--epochs", "2",
                     "--no-progress"]) == 0
    summary = read_json(out / "summary.json")
    assert all(row["n"] == 2 and row["seeds"] == [0, 1] for row in summary["rows"])
    assert all(len(read_lines(out / "runs" / "paper-full" / f"seed-{s}" / "metrics.jsonl")) == 2 for s in (0, 1))
    assert cli.main(["study", "run", "conventions", "--out", str(out), "--resume", "--epochs", "1", "--no-progress"]) == 0
    shorter = read_json(out / "summary.json")  # runs taken further count as finished; the first epoch is reported
    first = read_lines(out / "runs" / "paper-full" / "seed-1" / "metrics.jsonl")[0]
    assert shorter["epochs"] == 1 and shorter["complete"] and shorter["rows"][0]["values"][1] == first["test_accuracy"]
    before = snapshot(out)
    assert cli.main(["study", "run", "conventions", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert snapshot(out) == before
    assert cli.main(["study", "run", "conventions", "--out", str(out), "--resume", "--batch-size", "4"]) == 2
    assert "--batch-size 4 differs from the study's 8" in capsys.readouterr().err
    assert cli.main(["study", "run", "depth", "--out", str(out), "--resume"]) == 2
    assert "holds the study conventions, not depth" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["study", "run", "gradient-modes", "--routing-iterations", "2"], "varies --routing-iterations"),
    (["study", "run", "depth", "--squash", "peer"], "varies --squash"),
    (["study", "run", "conventions", "--seeds", "2", "--seed-list", "1,2"], "not both"),
    (["study", "run", "conventions", "--seed-list", "1,1"], "distinct"),
    (["study", "run", "no-such-study"], "no study named 'no-such-study'"),
    (["study", "run", "conventions", "--seed-list", "1" + "0" * 30], "--seed-list: expected distinct integers in [0, 2**63)"),
    (["study", "run", "conventions", "--seeds", "1" + "0" * 30], "--seeds must lie in [1, 1000], got 1" + "0" * 30),
    (["study", "run", "conventions", "--seeds", "1001"], "--seeds must lie in [1, 1000]"),
    (["study", "run", "depth", "--max-depth", "1" + "0" * 30], "--max-depth must lie in [1, 16]"),
])
def test_refusals_are_one_line_and_status_2(tmp_path, capsys, argv, message):
    assert cli.main([*argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_summary_of_a_folder_without_a_study_is_refused(tmp_path, capsys):
    assert cli.main(["study", "summary", str(tmp_path)]) == 2
    assert "holds no study.json" in capsys.readouterr().err


@pytest.fixture
def registry():
    saved = dict(STUDIES)
    yield
    STUDIES.clear()
    STUDIES.update(saved)


def test_a_study_registered_from_python_runs_with_its_parameters(tmp_path, data, registry):
    def widths(widest=2):
        return {f"digit{d}": {"digit_dim": d} for d in range(2, widest + 1)}

    register_study("digit-width", widths, varies="the digit capsules' size", epochs=1, seeds=1,
                   parameters={"widest": 2}, options={"log_gradflow": 1}, figures=("t_score",))
    assert list(study_registry.get_study("digit-width").configurations(widest=3)) == ["digit2", "digit3"]
    at = TINY.index("--digit-dim")
    tiny = TINY[:at] + TINY[at + 2:]
    assert cli.main(["study", "run", "digit-width", "--out", str(tmp_path / "w"), *data, *tiny]) == 0
    row = read_json(tmp_path / "w" / "summary.json")["rows"][0]
    assert row["config_id"] == "digit2" and row["n"] == 1
    line = read_lines(tmp_path / "w" / "runs" / "digit2" / "seed-0" / "gradflow.jsonl")[-1]
    assert row["metrics"]["t_score"]["mean"] == pytest.approx(line_values(line, ["t_score"])["t_score"])


@pytest.mark.parametrize("call, message", [
    (lambda: register_study("gradient-modes", {"a": {}}, varies="x"), "registered already"),
    (lambda: register_study("x", {"bad id!": {}}, varies="x"), "config id"),
    (lambda: register_study("x", {"a": {"colour": 1}}, varies="x"), "not a training option"),
    (lambda: register_study("x", {"a": {"routing_iterations": 0}}, varies="x"), "routing_iterations"),
    (lambda: register_study("x", {"a": {}}, varies="x", figures=("t_score",)), "log_gradflow"),
    (lambda: register_study("x", {"a": {}}, varies="x", figures=("speed",)), "unknown figure"),
    (lambda: register_study("x", {}, varies="x"), "non-empty"),
])
def test_register_study_checks_what_it_is_given(registry, call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.slow
def test_the_routing_ablation_trains_the_cnn_beside_the_capsnets(tmp_path, data):
    cnn = ["--cnn-channels", "2,2,2", "--cnn-hidden", "4,4"]
    out = tmp_path / "ablation"
    assert study("routing-ablation", out, data, "--seeds", "1", "--epochs", "1", *cnn) == 0
    rows = {row["config_id"]: row for row in read_json(out / "summary.json")["rows"]}
    assert set(rows) == {"baseline-cnn", "routing1-no-reconstruction", "routing1-reconstruction",
                         "routing3-no-reconstruction", "routing3-reconstruction"}
    cnn_config = read_json(out / "runs" / "baseline-cnn" / "seed-0" / "config.json")
    assert cnn_config["model"] == "cnn" and cnn_config["cnn_channels"] == [2, 2, 2] and "conv1_channels" not in cnn_config
    capsnet = read_json(out / "runs" / "routing1-no-reconstruction" / "seed-0" / "config.json")
    assert capsnet["reconstruction_weight"] == 0.0 and capsnet["routing_iterations"] == 1 and "cnn_channels" not in capsnet
    assert all(row["n"] == 1 for row in rows.values())


def test_a_study_wide_model_option_reaches_every_run(registry):
    from tinygrad_caps.models.app.studies.plan import PlannedConfig, PlannedRun, StudyPlan

    register_study("cnn-only", {"small": {"cnn_hidden": [4, 4]}}, varies="nothing", epochs=1, seeds=1,
                   options={"model": "cnn"})

    def plan(options, config_options):
        run = PlannedRun("small", 0, "runs/small/seed-0")
        return StudyPlan(study="cnn-only", epochs=1, seeds=[0], options=options,
                         configs=[PlannedConfig("small", config_options, [run])]), run

    cnn, run = plan({"model": "cnn", "cnn_channels": [2, 2, 2]}, {"cnn_hidden": [4, 4]})
    config = cnn.run_config(run).to_dict()
    assert config["model"] == "cnn" and config["cnn_hidden"] == [4, 4] and config["cnn_channels"] == [2, 2, 2]
    capsnet, run = plan({}, {})
    assert capsnet.run_config(run).model == "capsnet"


def test_resume_never_adopts_run_folders_of_no_study(tmp_path, data, capsys):
    stray = tmp_path / "stray"
    (stray / "runs" / "paper-full" / "seed-0").mkdir(parents=True)
    assert study("conventions", stray, data, "--resume") == 2
    assert "holds run folders but no study.json" in capsys.readouterr().err


def test_mean_curves_meet_at_the_steps_every_run_logged():
    from tinygrad_caps.models.app.studies.summary import _mean_curve
    every_10 = {"step": [10, 20, 30, 40, 50], "t": [1.0, 2.0, 3.0, 4.0, 5.0]}
    every_20 = {"step": [20, 40], "t": [20.0, 40.0]}
    assert _mean_curve([every_10, every_20]) == {"step": [20, 40], "t": [11.0, 22.0]}
    assert _mean_curve([every_10, {}]) == every_10


# --- refusals before anything is written, the plan's loader, the summary's lines, the lock ---


def test_resume_of_a_folder_without_a_study_is_refused_with_the_command_that_starts_one(tmp_path, data, capsys):
    out = tmp_path / "doesnotexist"
    assert study("gradient-modes", out, data, "--resume", "--seeds", "1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--resume: {out} holds no study (study.json) to continue" in err
    assert f"without --resume: tinygrad-caps study run gradient-modes --out {out} " in err
    assert "--resume" not in err.split("without --resume: ")[1] and "--seeds 1" in err
    assert not out.exists()
    out.mkdir()  # an empty folder holds no study either
    assert study("gradient-modes", out, data, "--resume") == 2
    assert "holds no study" in capsys.readouterr().err and list(out.iterdir()) == []


def test_the_tensorboard_export_is_kept_in_the_plan_and_done_when_the_study_is_continued(tmp_path, data, capsys,
                                                                                       monkeypatch):
    exported = []

    def export(run_dir, folder):
        exported.append(folder.relative_to(tb))
        return folder

    monkeypatch.setattr(study_command, "export_tensorboard", export)
    out, tb = tmp_path / "cut", tmp_path / "tb"
    clock = iter(range(10 ** 9))  # one second per reading of the clocks: the study stops within its first runs
    fake_time = types.SimpleNamespace(monotonic=lambda: float(next(clock)), perf_counter=time.perf_counter)
    for module in (study_command, study_driver, training):
        monkeypatch.setattr(module, "time", fake_time)
    assert study("conventions", out, data, "--seed-list", "5", "--epochs", "2", "--tensorboard-out", str(tb),
                 "--max-minutes", "0.1") == 75
    printed = capsys.readouterr().out
    assert read_json(out / "study.json")["tensorboard_out"] == str(tb)
    assert f"continue with: tinygrad-caps study run conventions --out {out} --resume --tensorboard-out {tb}" in printed
    for module in (study_command, study_driver, training):
        monkeypatch.setattr(module, "time", time)
    exported.clear()
    assert cli.main(["study", "run", "conventions", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert sorted(map(str, exported)) == [f"{c}/seed-5" for c in sorted(["paper-full", "paper-detach", "official-full",
                                                                         "official-detach"])]
    assert f"written: {tb} (TensorBoard, 4 runs)" in capsys.readouterr().out


def test_summary_names_the_files_it_writes_and_those_it_leaves_and_counts_in_the_singular(tmp_path, data, capsys):
    out = tmp_path / "one"
    assert study("conventions", out, data, "--seed-list", "0", "--epochs", "1") == 0
    printed = capsys.readouterr().out
    assert f"written: {out / 'summary.json'}" in printed and f"written: {out / 'summary.md'}" in printed
    assert "# Study conventions: test_accuracy after 1 epoch\n" in (out / "summary.md").read_text()
    assert "4 of 4 runs finished." in (out / "summary.md").read_text()
    (out / "summary.md").unlink()
    assert cli.main(["study", "summary", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"unchanged: {out / 'summary.json'}" in lines and f"written: {out / 'summary.md'}" in lines
    assert "after 1 epochs" not in "\n".join(lines)


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """A finished gradient-modes study (one seed, one epoch, gradient flow logged every step) to copy."""
    root = tmp_path_factory.mktemp("finished")
    data = study_data(root / "data")
    assert study("gradient-modes", root / "study", data, "--seed-list", "0", "--epochs", "1",
                 "--log-gradflow", "1") == 0
    return root / "study"


@pytest.fixture
def study_copy(finished_study, tmp_path):
    import shutil

    return Path(shutil.copytree(finished_study, tmp_path / "study"))


def _damage(plan):
    """{name: (change of a study.json, the field the refusal names)} for the damages below."""
    run = plan["configs"][0]["runs"][0]
    return {
        "configs a string": ({"configs": "routing1"}, "field configs must be a non-empty list"),
        "configs empty": ({"configs": []}, "field configs must be a non-empty list"),
        "config without runs": ({"configs": [{k: v for k, v in plan["configs"][0].items() if k != "runs"}]},
                                "field configs[0].runs is missing"),
        "run without path": ({"configs": [dict(plan["configs"][0], runs=[{"seed": 0}])]},
                             "field configs[0].runs[0].path is missing"),
        "run listed twice": ({"configs": [dict(plan["configs"][0], runs=[run, run])]},
                             "field configs[0].runs[1].seed 0: the run is listed twice"),
        "run in two configurations": ({"configs": [plan["configs"][0], dict(plan["configs"][1], runs=[run])]},
                                      "field configs[1].runs[0].path runs/routing1/seed-0: the run is listed twice"),
        "epochs a string": ({"epochs": "1"}, "field epochs must be a positive integer, got the string '1'"),
        "epochs 0": ({"epochs": 0}, "field epochs must be a positive integer, got the integer 0"),
        "epochs negative": ({"epochs": -1}, "field epochs must be a positive integer, got the integer -1"),
        "epochs NaN": ({"epochs": float("nan")}, "field epochs must be a positive integer, got the number nan"),
        "epochs true": ({"epochs": True}, "field epochs must be a positive integer, got true"),
        "seeds a string": ({"seeds": "0"}, "field seeds must be a non-empty list"),
        "seeds duplicated": ({"seeds": [0, 0]}, "field seeds lists the seed 0 twice"),
        "options a string": ({"options": "x"}, "field options must be an object, got the string 'x'"),
    }


@pytest.mark.parametrize("damage", list(_damage({"configs": [{"runs": [{}]}, {}]})))
def test_a_damaged_study_json_is_one_line_naming_the_file_and_the_field(study_copy, capsys, damage):
    path = study_copy / "study.json"
    plan = read_json(path)
    change, message = _damage(plan)[damage]
    path.write_text(json.dumps(dict(plan, **change)))
    before = snapshot(study_copy)
    for argv in (["study", "summary", str(study_copy)],
                 ["study", "run", "gradient-modes", "--out", str(study_copy), "--resume", "--no-progress"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{path}: {message}" in err, err
    assert snapshot(study_copy) == before


def test_summary_refuses_a_finished_run_whose_metrics_were_lost_and_never_writes_nan(study_copy, capsys):
    run = study_copy / "runs" / "routing3-full" / "seed-0"
    gradflow = run / "gradflow.jsonl"
    lines = read_lines(gradflow)
    lines[-1]["network"]["t_score"] = float("nan")
    gradflow.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cli.main(["study", "summary", str(study_copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{gradflow}: line {len(lines)}: NaN is not a finite number" in err
    assert "NaN" not in (study_copy / "summary.json").read_text()

    (run / "metrics.jsonl").unlink()
    assert cli.main(["study", "summary", str(study_copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"run {run}: its checkpoint has finished epoch 1 but its metrics.jsonl is missing" in err


def test_summary_json_holds_no_nan():
    from tinygrad_caps.models.app.studies.summary import summary_json
    from tinygrad_caps.models.errors import UsageError

    with pytest.raises(UsageError, match=r"rows\[0\]\.ci95\[1\] is not a finite number"):
        summary_json({"rows": [{"ci95": [0.5, float("inf")]}]}, "summary.json")
    assert json.loads(summary_json({"rows": [{"mean": None}]}, "summary.json")) == {"rows": [{"mean": None}]}


def test_out_inside_a_training_run_or_another_studys_runs_is_refused_before_anything_is_written(
        study_copy, tmp_path, data, capsys):
    train_run = tmp_path / "train-run"
    (train_run / "checkpoints").mkdir(parents=True)
    (train_run / "config.json").write_text("{}")
    cases = [(train_run, "is the run folder of a training run"),
             (train_run / "study", f"lies inside {train_run}, which is the run folder of a training run"),
             (study_copy / "runs" / "routing1" / "seed-0", "is the run folder of a training run"),
             (study_copy / "runs" / "mine", f"lies inside the run folders of the study in {study_copy}")]
    before = snapshot(tmp_path)
    for out, message in cases:
        assert study("conventions", out, data, "--seed-list", "0", "--epochs", "1") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--out {out} {message}" in err, err
    assert snapshot(tmp_path) == before and not (train_run / "study").exists()
    assert not (study_copy / "runs" / "mine").exists()


@pytest.mark.parametrize("name, extra, message", [
    ("conventions", ["--routing", "em"], "configuration official-full: routing 'em' takes no capsule bias"),
    ("depth", ["--routing", "em", "--max-depth", "1"], "configuration ours-depth0-bias: routing 'em' takes no capsule"),
    ("gradient-modes", ["--routing", "self-attention"],
     "configuration routing1: --log-mode-cosine: routing 'self-attention' is not iterative"),
    ("conventions", ["--device", "cpu", "--cuda-graph", "on"],
     "configuration paper-full: --cuda-graph on: the training step cannot be captured"),
    ("conventions", ["--dataset", "no-such-data"], "configuration paper-full: dataset 'no-such-data' not found"),
    ("conventions", ["--data-dir", "MISSING"], "configuration paper-full: dataset 'tiny' not found"),
])
def test_an_option_no_configuration_can_take_is_refused_before_the_folder_is_created(tmp_path, data, capsys, name,
                                                                                    extra, message):
    extra = [str(tmp_path / "missing") if word == "MISSING" else word for word in extra]
    out = tmp_path / "refused"
    assert study(name, out, data, "--seed-list", "0", "--epochs", "1", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_every_time_limited_call_trains_at_least_one_batch(tmp_path, data, registry):
    register_study("one", {"only": {}}, varies="nothing", epochs=1, seeds=1)
    out = tmp_path / "one"
    last = out / "runs" / "only" / "seed-0" / "checkpoints" / "last.npz"
    positions = []
    for _ in range(10):  # 3 batches and a test pass: a few calls, each moving the run on
        status = study("one", out, data, *(["--resume"] if positions else []), "--max-minutes", "1e-9")
        progress = training.tc.load(last)["progress"]
        positions.append((progress["epoch"], progress["step"]))
        if status == 0:
            break
        assert status == 75
    assert positions[-1] == (1, 0) and positions[0] >= (0, 1)
    assert all(a < b for a, b in zip(positions, positions[1:])), positions


def _lock(path, **fields):
    import os
    import socket

    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2026-01-01T00:00:00+00:00",
              "token": "x", **fields}
    path.write_text(json.dumps(record) + "\n")
    return path.read_text()


def test_a_second_driver_of_a_study_folder_is_refused_and_a_stale_lock_taken_over(study_copy, capsys):
    import os
    import subprocess
    import sys

    lock = study_copy / "study.lock"
    resume = ["study", "run", "gradient-modes", "--out", str(study_copy), "--resume", "--no-progress"]
    held = _lock(lock)  # a live driver: this very process
    before = snapshot(study_copy)
    assert cli.main(resume) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{study_copy} is being run by another study run (pid {os.getpid()} on " in err and "2026-01-01" in err
    assert snapshot(study_copy) == before and lock.read_text() == held

    _lock(lock, host="another-host.example")
    assert cli.main(resume) == 2
    assert f"if it has ended, delete {lock}" in capsys.readouterr().err

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _lock(lock, pid=int(gone.stdout))  # its driver has ended: taken over, and released at the end
    assert cli.main(resume) == 0
    assert not lock.exists() and not list(study_copy.glob("study.lock*"))


def test_the_lock_is_released_on_an_error_and_on_ctrl_c(study_copy, monkeypatch):
    from tinygrad_caps.models.errors import UsageError

    resume = ["study", "run", "gradient-modes", "--out", str(study_copy), "--resume", "--no-progress"]
    for stop, status in ((UsageError("stopped"), 2), (KeyboardInterrupt(), 130)):
        def drive_runs(*args, stop=stop, **kwargs):
            assert (study_copy / "study.lock").exists()
            raise stop

        monkeypatch.setattr(study_command, "drive_runs", drive_runs)
        assert cli.main(resume) == status
        assert not (study_copy / "study.lock").exists()


def test_a_real_second_process_is_refused_while_the_first_holds_the_folder(study_copy, capsys):
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys; from tinygrad_caps.models.app.studies.lock import study_lock\n"
                               # it holds the lock until killed
                               "with study_lock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()",
                               str(study_copy)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cli.main(["study", "run", "gradient-modes", "--out", str(study_copy), "--resume"]) == 2
        assert f"(pid {holder.pid} on " in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
