"""``tinygrad-caps visualize`` on tiny checkpoints trained here: the PNG and JSON files of each
picture (read back), evaluate's --reconstructions, and one-line errors with exit status 2."""
import json

import numpy as np
import pytest

from tinygrad_caps.data import write_idx
from tinygrad_caps.models import cli
from tinygrad_caps.models.analysis.pictures import TWEAKS, display_image
from tinygrad_caps.models.analysis.probes import ROTATIONS, TRANSLATIONS, transformed
from tinygrad_caps.models.app.training.trainer import train

from cli_helpers import TINY

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

ONE_EPOCH = [*TINY, "--epochs", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny IDX dataset (10x10, 3 classes), a CapsNet and a BaselineCNN trained on it for one epoch,
    and a CapsNet of another geometry (12x12)."""
    root = tmp_path_factory.mktemp("visualize")
    for name, size in (("tiny", 10), ("other", 12)):
        folder = root / "data" / name
        folder.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for stem, n in (("train", 24), ("t10k", 12)):
            labels = (np.arange(n) % 3).astype(np.uint8)
            images = (rng.random((n, size, size)) * 40).astype(np.uint8)
            for k, label in enumerate(labels):
                images[k, 2 + 2 * label:4 + 2 * label, 2:8] = 255
            write_idx(folder / f"{stem}-images-idx3-ubyte", images)
            write_idx(folder / f"{stem}-labels-idx1-ubyte", labels)
    data = str(root / "data")
    assert cli.main(["train", "--dataset", "tiny", "--data-dir", data, "--out", str(root / "caps"), *ONE_EPOCH]) == 0
    assert cli.main(["train", "--dataset", "other", "--data-dir", data, "--out", str(root / "other"), *ONE_EPOCH]) == 0
    train(dict(model="cnn", cnn_channels=[2, 2, 2], cnn_hidden=[4, 4], dataset="tiny", data_dir=data, batch_size=8,
               epochs=1, lr=1e-3, lr_decay=0.9, seed=0, augment=None, device="cpu"), root / "cnn",
          show_progress=False, log=lambda *a: None)
    return {"root": root, "caps": str(root / "caps" / "checkpoints" / "last.npz"),
            "cnn": str(root / "cnn" / "checkpoints" / "last.npz"),
            "other": str(root / "other" / "checkpoints" / "last.npz")}


def visualize(*args):
    return cli.main(["visualize", *args])


def png_size(path):
    with Image.open(path) as image:
        assert image.format == "PNG"
        pixels = np.asarray(image.convert("L"))
        assert pixels.std() > 10  # something is drawn
        return image.size


def test_reconstructions(runs, tmp_path):
    out = tmp_path / "recon.png"
    assert visualize("--checkpoint", runs["caps"], "--what", "reconstructions", "--out", str(out), "--count", "5") == 0
    assert png_size(out) == (612, 285)  # 5 columns of 1.1 inches, made wider by the key to the colours, at 100 dpi
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["what"] == "reconstructions" and record["count"] == 5 and record["dataset"] == "tiny"
    assert record["classes"] == ["0", "1", "2"]
    assert np.asarray(record["inputs"]).shape == np.asarray(record["reconstructions"]).shape == (5, 1, 10, 10)
    assert np.asarray(record["lengths"]).shape == (5, 3) and len(record["predicted"]) == 5
    assert record["labels"] == [0, 1, 2, 0, 1]
    lengths = np.asarray(record["lengths"])  # rounded to 4 decimals: the predicted one is the longest up to that
    assert np.all(lengths[np.arange(5), record["predicted"]] >= lengths.max(axis=1) - 1e-4)


def test_perturbation_grid(runs, tmp_path):
    out = tmp_path / "perturb.png"
    assert visualize("--checkpoint", runs["caps"], "--what", "perturbation", "--out", str(out), "--count", "2") == 0
    assert png_size(out) == (1069, 279)  # two grids of 11 x 4 tiles, 0.42 inches each, at 100 dpi
    record = json.loads(out.with_suffix(".json").read_text())
    grids = np.asarray(record["grids"])
    assert grids.shape == (2, 4, 11, 1, 10, 10)  # images, capsule dimensions, tweaks, C, H, W
    assert record["tweaks"] == pytest.approx([-0.25, -0.2, -0.15, -0.1, -0.05, 0.0, 0.05, 0.1, 0.15, 0.2, 0.25])
    assert len(TWEAKS) == 11
    # the untweaked column is the ordinary reconstruction, the same in every row
    recon = tmp_path / "r.png"
    visualize("--checkpoint", runs["caps"], "--what", "reconstructions", "--out", str(recon), "--count", "2")
    plain = np.asarray(json.loads(recon.with_suffix(".json").read_text())["reconstructions"])
    for d in range(4):
        np.testing.assert_allclose(grids[:, d, 5], plain, atol=2e-4)
    assert np.abs(grids[:, :, 0] - grids[:, :, -1]).max() > 1e-4  # tweaks change the picture


def test_robustness_with_a_cnn_to_compare_and_a_gif(runs, tmp_path):
    out = tmp_path / "robust.png"
    assert visualize("--checkpoint", runs["caps"], "--what", "robustness", "--out", str(out), "--count", "12",
                     "--compare", runs["cnn"], "--gif") == 0
    assert png_size(out) == (1355, 683)  # 13 frames of 1 inch, the curves above, the key below, at 100 dpi
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["rotation_degrees"] == list(range(-60, 61, 10)) and record["translation_pixels"] == list(range(7))
    assert list(record["accuracy"]) == ["caps (capsnet)", "cnn (cnn)"]  # the run folders' names
    for curves in record["accuracy"].values():
        assert len(curves["rotation"]) == 13 and len(curves["translation"]) == 7
        assert all(0.0 <= a <= 1.0 for a in curves["rotation"] + curves["translation"])
    strip = record["strip"]
    assert np.asarray(strip["frames"]).shape == np.asarray(strip["reconstructions"]).shape == (13, 1, 10, 10)
    assert len(strip["predicted"]) == 13
    with Image.open(out.with_suffix(".gif")) as gif:
        assert gif.format == "GIF" and gif.n_frames == 13


def test_robustness_accuracy_is_recomputable_from_the_transforms(runs):
    from tinygrad_caps.data import dataset_spec, load_dataset
    from tinygrad_caps.models.analysis.probes import predict, robustness_curves
    from tinygrad_caps.models.app.training.checkpoints import load_checkpoint_model

    model, config = load_checkpoint_model(runs["caps"], device="cpu")
    images, labels = load_dataset("tiny", "test", runs["root"] / "data")
    spec = dataset_spec("tiny", runs["root"] / "data")
    curves = robustness_curves({"m": model}, images, labels, spec.test_preprocess, rotations=[0, 30],
                               translations=[0, 3])
    assert curves["accuracy"]["m"]["rotation"][0] == curves["accuracy"]["m"]["translation"][0]
    rotated = spec.preprocess(transformed(images, 30))
    assert curves["accuracy"]["m"]["rotation"][1] == pytest.approx(float((predict(model, rotated) == labels).mean()))
    x = spec.preprocess(images)
    assert len(ROTATIONS) == 13 and len(TRANSLATIONS) == 7
    moved = transformed(x[:4], distance=2)
    np.testing.assert_allclose(moved[0, 0, :, 2:], x[0, 0, :, :-2], atol=1e-6)  # image 0 moves right
    np.testing.assert_allclose(moved[1, 0, 2:], x[1, 0, :-2], atol=1e-6)  # image 1 moves down


def test_display_image_layouts():
    assert display_image(np.zeros((1, 4, 5))).shape == (4, 5)
    assert display_image(np.zeros((2, 4, 5))).shape == (4, 10)  # stereo pair side by side
    assert display_image(np.zeros((3, 4, 5))).shape == (4, 5, 3)
    scaled = display_image(np.array([[[-2.0, 0.0], [2.0, 1.0]]]))
    assert scaled.min() == 0.0 and scaled.max() == 1.0


def test_evaluate_reconstructions_option_still_works(runs, tmp_path, capsys):
    out = tmp_path / "eval.png"
    assert cli.main(["evaluate", "--checkpoint", runs["caps"], "--reconstructions", str(out)]) == 0
    assert png_size(out)[0] == 1365  # 12 test images, 1.1 inches each and 0.45 of margins, at 100 dpi
    record = json.loads(out.with_suffix(".json").read_text())
    assert np.asarray(record["reconstructions"]).shape == (12, 1, 10, 10)
    assert record["labels"] == [k % 3 for k in range(12)] and len(record["predicted"]) == 12
    assert record["classes"] == ["0", "1", "2"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == [f"written: {out}", f"written: {out.with_suffix('.json')}"]


@pytest.mark.parametrize("case, message", [
    ("missing", "no-such.npz"),
    ("gif", "--gif goes with --what robustness"),
    ("cnn", "needs a CapsNet checkpoint"),
    ("suffix", "pictures can be .png, .pdf or .svg files, not .jpg"),
    ("geometry", "takes 1x12x12 images"),
    ("dataset", "not found"),
])
def test_bad_input_gives_one_line_and_status_2(runs, tmp_path, capsys, case, message):
    out = str(tmp_path / "x.png")
    args = {
        "missing": ["--checkpoint", str(tmp_path / "no-such.npz"), "--what", "reconstructions", "--out", out],
        "gif": ["--checkpoint", runs["caps"], "--what", "reconstructions", "--out", out, "--gif"],
        "cnn": ["--checkpoint", runs["cnn"], "--what", "perturbation", "--out", out],
        "suffix": ["--checkpoint", runs["caps"], "--what", "reconstructions", "--out", str(tmp_path / "x.jpg")],
        "geometry": ["--checkpoint", runs["caps"], "--what", "robustness", "--out", out, "--compare", runs["other"]],
        "dataset": ["--checkpoint", runs["caps"], "--what", "reconstructions", "--out", out, "--dataset", "absent"],
    }[case]
    assert visualize(*args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("tinygrad-caps visualize: error:")
    assert not (tmp_path / "x.png").exists()


def test_unknown_what_is_a_usage_error(runs, tmp_path):
    with pytest.raises(SystemExit) as info:
        visualize("--checkpoint", runs["caps"], "--what", "everything", "--out", str(tmp_path / "x.png"))
    assert info.value.code == 2


# ----- what the pictures show, the files each command writes and says it wrote -----
def assert_nothing_clipped(fig):
    """Every piece of text lies inside the figure, and no two titles overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    drawn = fig.get_tightbbox(renderer)  # inches: everything drawn, tick labels, titles, legends and texts
    width, height = fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01, drawn
    titles = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    for k, a in enumerate(titles):
        assert not any(a.overlaps(b) for b in titles[k + 1:])


LONG_NAMES = ["Ankle boot", "T-shirt/top", "averyveryverylongclassname"]


def test_reconstruction_titles_are_whole_with_a_key_and_the_true_class_of_wrong_ones():
    from tinygrad_caps.models.analysis.pictures import reconstructions_figure

    x = np.random.default_rng(0).random((3, 1, 10, 10))
    fig = reconstructions_figure(x, x, labels=np.array([0, 1, 2]), predicted=np.array([0, 2, 1]),
                                 class_names=LONG_NAMES)
    titles = [ax.title for ax in fig.axes if ax.get_title()]
    assert [t.get_text().replace("\n", " ") for t in titles] == [
        "Ankle boot", "averyveryverylongclassname (true: T-shirt/top)", "T-shirt/top (true: averyveryverylongclassname)"]
    assert [t.get_color() for t in titles] == ["black", "red", "red"]
    key = [t.get_text() for t in fig.legends[0].get_texts()]
    assert key == ["predicted class, correct", "predicted class, wrong (true class below)"]
    assert_nothing_clipped(fig)
    one = reconstructions_figure(x[:1], x[:1], np.array([0]), np.array([1]), LONG_NAMES)  # narrower than its key
    assert_nothing_clipped(one)


def test_perturbation_grid_has_hairlines_and_no_negative_zero():
    from tinygrad_caps.models.analysis.pictures import TWEAKS, perturbation_figure

    assert not np.signbit(TWEAKS[5]) and TWEAKS[5] == 0
    grids = np.random.default_rng(0).random((2, 4, len(TWEAKS), 1, 10, 10))
    fig = perturbation_figure(grids, np.array([0, 2]), LONG_NAMES)
    for ax in fig.axes:
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks[5] == "0.00" and not any(t.startswith("-0.00") for t in ticks)
        assert all(line.get_linewidth() <= 0.5 for line in ax.lines)  # no heavy borders between tiles
        assert all(side.get_linewidth() <= 0.5 for side in ax.spines.values())
    assert "averyveryverylongclassname" in fig.axes[1].get_title()
    assert_nothing_clipped(fig)


def test_robustness_picture_keeps_class_names_whole():
    from tinygrad_caps.models.analysis.pictures import robustness_figure

    steps = len(ROTATIONS)
    frames = np.random.default_rng(0).random((steps, 1, 10, 10))
    curves = {"rotation_degrees": list(ROTATIONS), "translation_pixels": list(TRANSLATIONS),
              "accuracy": {"quick (capsnet)": {"rotation": [0.5] * steps, "translation": [0.5] * len(TRANSLATIONS)}}}
    strip = {"frames": frames, "reconstructions": frames, "predicted": np.arange(steps) % 3,
             "lengths": np.full((steps, 3), 0.004), "rotations": [int(r) for r in ROTATIONS], "label": 0}
    fig = robustness_figure(curves, strip, LONG_NAMES)
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes if ax.get_title()]
    assert titles[2] == "-40° averyveryverylongclassname |v| 4.0e-03"  # whole, and a small length not shown as 0.00
    assert "true class: Ankle boot" in [t.get_text() for t in fig.texts][0]
    assert_nothing_clipped(fig)


def test_default_names_of_evaluate_and_visualize_differ_and_every_file_is_printed(runs, capsys):
    run = runs["root"] / "caps"
    assert cli.main(["evaluate", "--checkpoint", runs["caps"], "--reconstructions"]) == 0
    assert visualize("--checkpoint", runs["caps"], "--what", "reconstructions") == 0
    assert visualize("--checkpoint", runs["caps"], "--what", "robustness", "--count", "4", "--gif") == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("written: ")]
    expected = [run / name for name in ("evaluate-reconstructions.png", "evaluate-reconstructions.json",
                                        "visualize-reconstructions.png", "visualize-reconstructions.json",
                                        "visualize-robustness.png", "visualize-robustness.gif",
                                        "visualize-robustness.json")]
    assert printed == [f"written: {path}" for path in expected]
    assert all(path.is_file() for path in expected)


@pytest.mark.parametrize("suffix, magic", [(".pdf", b"%PDF"), (".svg", b"<?xml"), (".PNG", b"\x89PNG")])
def test_pictures_in_every_format_matplotlib_writes_well(runs, tmp_path, suffix, magic):
    out = tmp_path / f"p{suffix}"
    assert visualize("--checkpoint", runs["caps"], "--what", "perturbation", "--count", "1", "--out", str(out)) == 0
    assert out.read_bytes()[:len(magic)] == magic and out.with_suffix(".json").exists()


@pytest.mark.parametrize("name, message", [
    ("r.xyz", "pictures can be .png, .pdf or .svg files, not .xyz"),
    ("r", "has no suffix"),
    ("folder.png", "is a folder"),
    ("folder/", "is a folder"),
])
def test_evaluate_checks_the_reconstructions_name_before_evaluating(runs, tmp_path, capsys, name, message):
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "folder").mkdir()
    before = sorted(tmp_path.rglob("*"))
    target = str(tmp_path / name) + ("/" if name.endswith("/") else "")
    assert cli.main(["evaluate", "--checkpoint", runs["caps"], "--reconstructions", target]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the evaluation, not after printing it
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and message in err and "--reconstructions" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_visualize_and_evaluate_show_progress_bars_on_a_terminal_only(runs, tmp_path, capsys, monkeypatch):
    from tinygrad_caps.models.app.training import progress

    args = ["--checkpoint", runs["caps"], "--what", "robustness", "--count", "4", "--out", str(tmp_path / "r.png")]
    assert visualize(*args) == 0
    assert capsys.readouterr().err == ""  # not a terminal: no bar
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    assert visualize(*args) == 0
    assert "robustness: " in capsys.readouterr().err
    assert cli.main(["evaluate", "--checkpoint", runs["caps"]]) == 0
    assert "evaluate: " in capsys.readouterr().err
    assert visualize(*args, "--no-progress") == 0
    assert cli.main(["evaluate", "--checkpoint", runs["caps"], "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_missing_matplotlib_or_pillow_is_refused_before_any_work(runs, tmp_path, capsys, monkeypatch):
    import sys

    from tinygrad_caps.models.analysis import plots

    plots.pyplot()  # matplotlib itself imports PIL.Image: loaded first, as it is by the time a picture is drawn
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # import PIL.Image raises ImportError
    assert visualize("--checkpoint", runs["caps"], "--what", "robustness", "--gif", "--out", str(tmp_path / "r.png")) == 2
    assert "--gif needs Pillow" in capsys.readouterr().err
    monkeypatch.setattr(plots, "pyplot", lambda: None)
    assert cli.main(["evaluate", "--checkpoint", runs["caps"], "--reconstructions", str(tmp_path / "r.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "pictures need matplotlib" in captured.err
    assert list(tmp_path.iterdir()) == []


# ----- a study's summary.png -----
ALL_FIGURES = ["inner_share", "mode_cosine", "t_score", "d_score", "digit_d_score", "lowest_grad_norm"]


def summary_row(config_id, accuracy=(0.5, 0.6), gradflow=True, inner=True, hidden=False, cosine=1.0 - 1e-6):
    """A summary.json row with two finished seeds (none for ``accuracy=()``) and its mean curves."""
    if not accuracy:
        return {"config_id": config_id, "config": {}, "n": 0, "seeds": [], "values": [], "mean": None, "std": None,
                "ci95": None, "metrics": {}, "curves": {"learning": {}, "gradflow": {}}}
    steps = [10, 20, 30]
    curve = {"step": steps, "inner_share": [0.1, 0.2, 0.3] if inner else [None] * 3,
             "mode_cosine": [cosine] * 3, "t_score": [0.0, 1e-3, 2e-3], "d_score": [0.1, 0.2, 0.3] if hidden else [None] * 3,
             "digit_d_score": [0.01, 0.02, 0.03], "lowest_grad_norm": [1e-3, 1e-4, 1e-5]}
    mean = sum(accuracy) / len(accuracy)
    return {"config_id": config_id, "config": {}, "n": len(accuracy), "seeds": list(range(len(accuracy))),
            "values": list(accuracy), "mean": mean, "std": 0.07, "ci95": [mean - 0.1, mean + 0.1], "metrics": {},
            "curves": {"learning": {"epoch": [1, 2], "test_accuracy": [0.4, mean]}, "gradflow": curve if gradflow else {}}}


def study_summary(rows, figures=ALL_FIGURES, finished=None):
    finished = sum(row["n"] for row in rows) if finished is None else finished
    return {"study": "made-up", "metric": "test_accuracy", "epochs": 2, "complete": all(row["n"] for row in rows),
            "runs_finished": finished, "runs_planned": 2 * len(rows), "figures": list(figures), "rows": rows,
            "comparisons": []}


def panel(fig, title_start):
    return next(ax for ax in fig.axes if ax.get_title().startswith(title_start))


def panel_texts(ax):
    """The texts written in a panel, their wrapped lines joined again."""
    return " ".join(t.get_text().replace("\n", " ") for t in ax.texts)


def test_study_summary_is_a_readable_grid_of_every_figure(tmp_path):
    from tinygrad_caps.models.analysis.figures import FIGURES
    from tinygrad_caps.models.analysis.study_figures import plot_study_summary, study_summary_figure

    fig = study_summary_figure(study_summary([summary_row("a"), summary_row("b", (0.7, 0.8), hidden=True)]))
    assert len(fig.axes) == 2 + len(ALL_FIGURES)  # every figure the study reports, not two of them
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in fig.axes} == {(4, 2)}  # two panels a row
    for name in ALL_FIGURES:
        label = FIGURES[name].label
        assert any(label in ax.get_title() for ax in fig.axes), name
    width, height = fig.get_size_inches()
    assert height > 0.9 * width  # a grid, not a strip
    fig.canvas.draw()
    texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    assert min(t.get_fontsize() for t in texts if t.get_text()) >= 11
    assert min(t.get_fontsize() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()) >= 10
    renderer = fig.canvas.get_renderer()
    for left, right in zip(fig.axes[0::2], fig.axes[1::2]):  # a right panel's y label clears the left panel
        assert right.yaxis.label.get_window_extent(renderer).x0 > left.get_tightbbox(renderer).x1
    for ax in fig.axes:  # "log scale" only on a log axis
        assert ("log scale" in ax.get_ylabel()) == (ax.get_yscale() == "log"), ax.get_title()
    assert panel(fig, "1 - ").get_yscale() == "log" and panel(fig, "D of DigitCaps").get_yscale() == "linear"
    plot_study_summary(study_summary([summary_row("a")]), tmp_path / "summary.png")
    with Image.open(tmp_path / "summary.png") as image:
        assert image.size[1] > 600 and image.size[0] <= 1400


def test_study_summary_names_coinciding_curves_and_what_a_panel_does_not_draw():
    from tinygrad_caps.models.analysis.study_figures import study_summary_figure

    rows = [summary_row("routing1", inner=False, cosine=1.0), summary_row("routing3-full"),
            summary_row("routing3-detach"), summary_row("unfinished", accuracy=()),
            summary_row("deep", (0.1, 0.2), hidden=True)]
    fig = study_summary_figure(study_summary(rows))
    learning = panel(fig, "learning curves")
    labels = learning.get_legend_handles_labels()[1]
    assert labels[:3] == ["routing1", "routing3-full (= routing1)", "routing3-detach (= routing1)"]
    assert "unfinished (no finished run)" in panel_texts(learning)
    inner = panel(fig, "inner iterations")
    assert "routing1 (no inner iteration: one routing step)" in panel_texts(inner)
    assert "routing1" not in inner.get_legend_handles_labels()[1]
    hidden = panel(fig, "D-score (hidden layers)")
    assert "no hidden capsule layer" in panel_texts(hidden) and "routing3-full" in panel_texts(hidden)
    assert hidden.get_legend_handles_labels()[1] == ["deep"]
    cosine = panel(fig, "1 - cos")  # identical gradients (1 - cos = 0) on a marked floor, not left out
    assert "routing1" in cosine.get_legend_handles_labels()[1]
    assert any("identical, to rounding" in label for label in cosine.get_legend_handles_labels()[1])
    bars = panel(fig, "mean, 95% interval")
    assert "no finished run" in panel_texts(bars)
    # no curve hides under a note: every note sits above the highest point drawn, below the lowest,
    # or under the panel (a bounded axis is not raised beyond its range to make room)
    fig.canvas.draw()
    for ax in fig.axes[1:]:
        for note in (t for t in ax.texts if t.get_text().startswith("not drawn")):
            heights = [line.get_transform().transform(line.get_xydata())[:, 1] for line in ax.lines]
            top, bottom = max(np.nanmax(h) for h in heights), min(np.nanmin(h) for h in heights)
            box = note.get_window_extent()
            assert box.y0 >= top or box.y1 <= bottom or box.y1 <= ax.get_window_extent().y0, ax.get_title()


def test_study_summary_without_a_finished_run_says_so_in_every_panel():
    from tinygrad_caps.models.analysis.study_figures import study_summary_figure

    rows = [summary_row("a", accuracy=()), summary_row("b", accuracy=())]
    fig = study_summary_figure(study_summary(rows, figures=["t_score", "mode_cosine", "inner_share"]))
    assert len(fig.axes) == 5 and "0 of 4 runs finished" in fig._suptitle.get_text()
    for ax in fig.axes:
        assert "no finished run yet (0 of 4)" in panel_texts(ax), ax.get_title()
        assert not ax.lines and "log scale" not in ax.get_ylabel()
