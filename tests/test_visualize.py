"""``tinygrad-caps visualize`` on tiny checkpoints trained here: the PNG and JSON files of each
picture (read back), evaluate's --reconstructions, and one-line errors with exit status 2."""
import json

import numpy as np
import pytest

from tinygrad_caps.data import write_idx
from tinygrad_caps.models import cli
from tinygrad_caps.models.training import train
from tinygrad_caps.models.visualize import ROTATIONS, TRANSLATIONS, TWEAKS, display_image, transformed

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

TINY = ["--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4", "--digit-dim", "4",
        "--kernel-size", "3", "--batch-size", "8", "--no-progress", "--epochs", "1"]


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
    assert cli.main(["train", "--dataset", "tiny", "--data-dir", data, "--out", str(root / "caps"), *TINY]) == 0
    assert cli.main(["train", "--dataset", "other", "--data-dir", data, "--out", str(root / "other"), *TINY]) == 0
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
    assert png_size(out) == (550, 260)
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["what"] == "reconstructions" and record["count"] == 5 and record["dataset"] == "tiny"
    assert np.asarray(record["inputs"]).shape == np.asarray(record["reconstructions"]).shape == (5, 1, 10, 10)
    assert np.asarray(record["lengths"]).shape == (5, 3) and len(record["predicted"]) == 5
    assert record["labels"] == [0, 1, 2, 0, 1]
    lengths = np.asarray(record["lengths"])  # rounded to 4 decimals: the predicted one is the longest up to that
    assert np.all(lengths[np.arange(5), record["predicted"]] >= lengths.max(axis=1) - 1e-4)


def test_perturbation_grid(runs, tmp_path):
    out = tmp_path / "perturb.png"
    assert visualize("--checkpoint", runs["caps"], "--what", "perturbation", "--out", str(out), "--count", "2") == 0
    assert png_size(out) == (1150, 340)
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
    assert png_size(out) == (1300, 666)
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["rotation_degrees"] == list(range(-60, 61, 10)) and record["translation_pixels"] == list(range(7))
    assert len(record["accuracy"]) == 2 and any(name.startswith("cnn") for name in record["accuracy"])
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
    from tinygrad_caps.models.training import load_checkpoint_model
    from tinygrad_caps.models.visualize import predict, robustness_curves

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


def test_evaluate_reconstructions_option_still_works(runs, tmp_path):
    out = tmp_path / "eval.png"
    assert cli.main(["evaluate", "--checkpoint", runs["caps"], "--reconstructions", str(out)]) == 0
    assert png_size(out)[0] == 1320  # 12 test images, 1.1 inches each at 100 dpi
    assert np.asarray(json.loads(out.with_suffix(".json").read_text())["reconstructions"]).shape == (12, 1, 10, 10)


@pytest.mark.parametrize("case, message", [
    ("missing", "no-such.npz"),
    ("gif", "--gif goes with --what robustness"),
    ("cnn", "needs a CapsNet checkpoint"),
    ("suffix", "must name a .png file"),
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
