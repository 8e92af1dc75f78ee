"""``tinygrad-caps study list | run | summary`` end to end on a tiny IDX dataset and tiny models: the
study's folder (study.json, run folders that evaluate and plot read), the summary's arithmetic
against the run folders' own metrics and gradient-flow logs, resume (a finished study is left
byte for byte as it was; one stopped by --max-minutes ends with the metrics of one never stopped),
the registry from Python, and the refusals."""
import json
import math
import time
import types

import numpy as np
import pytest

from helpers import metrics_without_times, write_striped_dataset
from tinygrad_caps.models import cli
from tinygrad_caps.models.app import study_registry, study_runner, training
from tinygrad_caps.models.app.commands import study as study_command
from tinygrad_caps.models.app.study_registry import STUDIES, register_study
from tinygrad_caps.models.app.study_summary import line_figures

T975_DF1 = 12.7062047362  # Student's t, 97.5% quantile, one degree of freedom
TINY = ["--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4", "--digit-dim", "4",
        "--kernel-size", "3", "--batch-size", "8", "--no-progress"]


@pytest.fixture
def data(tmp_path):
    write_striped_dataset(tmp_path / "data" / "tiny", (24, 12), compress=False)
    return ["--dataset", "tiny", "--data-dir", str(tmp_path / "data")]


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
    built_in = {"routing-ablation", "gradient-modes", "depth", "conventions", "routing-algorithms"}
    assert set(STUDIES) >= built_in
    for line in lines:  # (the documents' examples may have registered studies of other budgets)
        assert "configurations" in line
        assert line.split()[0] not in built_in or "default 5 epochs x 3 seeds" in line
    assert "16 configurations" in next(line for line in lines if line.startswith("depth"))


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
    for module in (study_command, study_runner, training):
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
    assert "--batch-size 4 differs from the run's 8" in capsys.readouterr().err
    assert cli.main(["study", "run", "depth", "--out", str(out), "--resume"]) == 2
    assert "holds the study conventions, not depth" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["study", "run", "gradient-modes", "--routing-iterations", "2"], "varies --routing-iterations"),
    (["study", "run", "depth", "--squash", "peer"], "varies --squash"),
    (["study", "run", "conventions", "--seeds", "2", "--seed-list", "1,2"], "not both"),
    (["study", "run", "conventions", "--seed-list", "1,1"], "distinct"),
    (["study", "run", "no-such-study"], "no study named 'no-such-study'"),
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
    assert row["metrics"]["t_score"]["mean"] == pytest.approx(line_figures(line)["t_score"])


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
    register_study("cnn-only", {"small": {"cnn_hidden": [4, 4]}}, varies="nothing", epochs=1, seeds=1,
                   options={"model": "cnn"})
    plan = {"options": {"model": "cnn", "cnn_channels": [2, 2, 2]}, "epochs": 1}
    options = study_runner.run_config(plan, {"options": {"cnn_hidden": [4, 4]}}, seed=0)
    assert options["model"] == "cnn" and options["cnn_hidden"] == [4, 4]
    assert study_runner.run_config({"options": {}, "epochs": 1}, {"options": {}}, seed=0)["model"] == "capsnet"


def test_resume_never_adopts_run_folders_of_no_study(tmp_path, data, capsys):
    stray = tmp_path / "stray"
    (stray / "runs" / "paper-full" / "seed-0").mkdir(parents=True)
    assert study("conventions", stray, data, "--resume") == 2
    assert "holds run folders but no study.json" in capsys.readouterr().err


def test_mean_curves_meet_at_the_steps_every_run_logged():
    from tinygrad_caps.models.app.study_summary import _mean_curve
    every_10 = {"step": [10, 20, 30, 40, 50], "t": [1.0, 2.0, 3.0, 4.0, 5.0]}
    every_20 = {"step": [20, 40], "t": [20.0, 40.0]}
    assert _mean_curve([every_10, every_20]) == {"step": [20, 40], "t": [11.0, 22.0]}
    assert _mean_curve([every_10, {}]) == every_10
