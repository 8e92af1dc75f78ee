"""Hostile files and values, case by case: each ends as docs/reliability.md's "Bad input" says (one line and exit
status 2 for user errors, a traceback and exit status 1 for bugs), and nothing is created or
accepted silently. The generated cases are in test_fuzz_cli.py; kills and signals in
test_crash_consistency.py."""
import errno
import gzip
import io
import os
import zipfile

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.data import IDXError, read_idx, write_idx
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.training import preflight, trainer as training
from tinygrad_caps.models.errors import UsageError

from cli_helpers import TINY_CPU, train_argv


def make_dataset(root, name="tiny", labels_of=None, n_train=40, n_test=16, label_dtype=np.uint8, size=10):
    folder = root / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for stem, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % 3).astype(label_dtype) if labels_of is None else labels_of(stem, n)
        images = (rng.random((n, size, size)) * 255).astype(np.uint8)
        write_idx(folder / f"{stem}-images-idx3-ubyte.gz", images, compress=True)
        write_idx(folder / f"{stem}-labels-idx1-ubyte", labels)
    return root


@pytest.fixture
def data_dir(tmp_path):
    return make_dataset(tmp_path / "data")


def train_args(data_dir, out, *extra, dataset="tiny"):
    return train_argv(data_dir, out, *extra, options=TINY_CPU, dataset=dataset)


def one_line_error(capsys, status, expected_status=2):
    captured = capsys.readouterr()
    assert status == expected_status, captured.err
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tinygrad-caps "), captured.err
    return lines[0], captured.out


@pytest.fixture
def finished_run(data_dir, tmp_path):
    out = tmp_path / "run"
    assert cli.main(train_args(data_dir, out, "--epochs", "1")) == 0
    return out


# --- section 9: user errors are one line, bugs keep their traceback, no folder before the first batch

def test_a_bug_prints_its_traceback_and_asks_for_a_report(data_dir, tmp_path, capsys, monkeypatch):
    def broken(self):
        raise RuntimeError("an engine bug")

    monkeypatch.setattr(training.Trainer, "run", broken)
    assert cli.main(train_args(data_dir, tmp_path / "run")) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "an engine bug" in err and "bug in tinygrad-caps" in err


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, capsys):
    status = cli.main(["--debug", "train", "--dataset", "nowhere", "--data-dir", str(tmp_path), *TINY_CPU])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" in err and "not found" in err.strip().splitlines()[-1]
    status = cli.main(["train", "--dataset", "nowhere", "--data-dir", str(tmp_path), *TINY_CPU, "--debug"])
    assert status == 2 and "Traceback" in capsys.readouterr().err


def test_no_run_folder_and_no_run_folder_line_when_training_cannot_start(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    if not tc.gpu_available():
        line, stdout = one_line_error(capsys, cli.main(train_args(data_dir, out, "--device", "cuda")))
        assert "no usable GPU" in line and "run folder" not in stdout and not out.exists()
    line, stdout = one_line_error(capsys, cli.main(train_args(data_dir, out, "--kernel-size", "9")))
    assert "too small" in line and "run folder" not in stdout and not out.exists()
    assert cli.main(train_args(data_dir, out, "--epochs", "1")) == 0
    assert capsys.readouterr().out.count(f"run folder: {out}") == 1


def test_a_ctrl_c_during_start_up_exits_130_quietly(data_dir, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(preflight, "dataset_spec", interrupted)
    assert cli.main(train_args(data_dir, tmp_path / "run")) == 130
    assert capsys.readouterr().err == "" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("problem", ["existing file", "under a file", "name too long"])
def test_an_unusable_out_is_one_line(data_dir, tmp_path, capsys, problem):
    (tmp_path / "file").write_text("x")
    out = {"existing file": tmp_path / "file", "under a file": tmp_path / "file" / "run",
           "name too long": tmp_path / ("x" * 300)}[problem]
    line, _ = one_line_error(capsys, cli.main(train_args(data_dir, out)))
    assert "--out" in line


def test_a_folder_where_no_file_can_be_made_is_refused_before_any_work(data_dir, tmp_path, capsys, monkeypatch):
    """As root every access check passes, yet /proc or a read-only mount takes no new file: the
    check tries to make one."""
    from tinygrad_caps.models.app.training import output_paths

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(output_paths.tempfile, "mkstemp", read_only)
    line, _ = one_line_error(capsys, cli.main(train_args(data_dir, tmp_path / "run")))
    assert "--out" in line and "not writable" in line and not (tmp_path / "run").exists()
    with pytest.raises(UsageError, match="not writable"):
        output_paths.check_picture_path(tmp_path / "r.png", "--reconstructions")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unreadable_data_and_unwritable_out_are_one_line(data_dir, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    line, _ = one_line_error(capsys, cli.main(train_args(data_dir, locked / "run")))
    assert "not writable" in line
    victim = data_dir / "tiny" / "train-labels-idx1-ubyte"
    victim.chmod(0)
    line, _ = one_line_error(capsys, cli.main(train_args(data_dir, tmp_path / "run")))
    assert "train-labels" in line


def test_a_permission_error_while_reading_data_is_one_line(data_dir, tmp_path, capsys, monkeypatch):
    from tinygrad_caps.data import idx

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(idx, "open", denied, raising=False)
    line, _ = one_line_error(capsys, cli.main(train_args(data_dir, tmp_path / "run")))
    assert "Permission denied" in line and not (tmp_path / "run").exists()


def test_a_full_disk_during_a_checkpoint_write_is_one_line_and_leaves_no_temporary(data_dir, tmp_path, capsys,
                                                                                   monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    line, _ = one_line_error(capsys, cli.main(train_args(data_dir, tmp_path / "run", "--epochs", "1")))
    assert "No space left on device" in line
    assert not list((tmp_path / "run" / "checkpoints").glob(".tmp-*"))


# --- absurd sizes are refused before allocating, saying how much they need

@pytest.mark.parametrize("option, value", [("--conv1-channels", "1000000000"), ("--digit-dim", "10000000"),
                                           ("--primary-types", "100000000")])
def test_a_model_that_cannot_fit_says_what_it_needs(data_dir, tmp_path, capsys, option, value):
    line, _ = one_line_error(capsys, cli.main(train_args(data_dir, tmp_path / "run", option, value)))
    assert "cannot fit" in line and "GiB" in line


def test_huge_labels_in_an_idx_folder_are_refused(tmp_path, capsys):
    def huge(stem, n):
        labels = (np.arange(n) % 3).astype(np.int32)
        labels[0] = 2 ** 31 - 1
        return labels

    data = make_dataset(tmp_path / "data", labels_of=huge)
    line, _ = one_line_error(capsys, cli.main(train_args(data, tmp_path / "run")))
    assert "never occur" in line or "only" in line


def test_a_checkpoint_array_declaring_1e13_elements_is_refused_before_allocation(finished_run, tmp_path, capsys):
    source = finished_run / "checkpoints" / "last.npz"
    forged = tmp_path / "forged.npz"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(forged, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "a0.npy":
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                              "shape": (10 ** 13,)})
                data = header.getvalue() + data[len(header.getvalue()):]
            zout.writestr(info, data)
    with pytest.raises(tc.CheckpointError, match="declares"):
        tc.load(forged)
    line, _ = one_line_error(capsys, cli.main(["evaluate", "--checkpoint", str(forged), "--device", "cpu"]))
    assert "declares" in line


def test_a_config_with_2_to_the_40_classes_is_refused(finished_run, tmp_path, capsys):
    checkpoint = tc.load(finished_run / "checkpoints" / "best.npz")
    checkpoint["config"]["num_classes"] = 2 ** 40
    tc.save(checkpoint, tmp_path / "huge.npz")
    line, _ = one_line_error(capsys, cli.main(["evaluate", "--checkpoint", str(tmp_path / "huge.npz")]))
    assert "cannot fit" in line


def test_gzip_bombs_are_refused_after_the_size_the_header_declares(tmp_path):
    header = bytes([0, 0, 8, 3]) + np.array([10, 28, 28], dtype=">u4").tobytes()
    bomb = tmp_path / "bomb.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(header)
        for _ in range(64):  # 1 GiB of zeros in about 1 MB
            f.write(bytes(1 << 24))
    assert bomb.stat().st_size < 2 << 20
    with pytest.raises(IDXError, match="longer than its header"):
        read_idx(bomb)


# --- checkpoints with wrong content on --resume: the first wrong entry is named

def _resume_with(finished_run, data_dir, capsys, damage):
    checkpoint = tc.load(finished_run / "checkpoints" / "last.npz")
    damage(checkpoint)
    tc.save(checkpoint, finished_run / "checkpoints" / "last.npz")
    return one_line_error(capsys, cli.main(train_args(data_dir, finished_run, "--epochs", "2", "--resume")))[0]


@pytest.mark.parametrize("damage, named", [
    (lambda c: c.pop("model"), "model is missing"),
    (lambda c: c.pop("progress"), "progress is missing"),
    (lambda c: c["progress"].pop("sums"), "progress.sums is missing"),
    (lambda c: c["optimizer"].pop("state"), "optimizer.state is missing"),
    (lambda c: c["progress"].update(epoch="1"), "progress.epoch must be an integer"),
    (lambda c: c["rng"].update(state={"state": "garbage", "inc": 3}), "rng.state.state"),
    (lambda c: c["optimizer"]["hyperparameters"].update(lr="0.1"), "optimizer.hyperparameters.lr"),
    (lambda c: c["scheduler"].update(optimizer=1, base_lr=2.0), "unknown keys optimizer"),
    (lambda c: c["model"].update({"conv1.weight": c["model"]["conv1.weight"].astype(np.int32)}), "conv1.weight"),
    (lambda c: c["model"].update({"conv1.weight": c["model"]["conv1.weight"].astype(str)}), "conv1.weight"),
    (lambda c: c["model"].update({"conv1.weight": c["model"]["conv1.weight"].astype(np.complex64)}), "conv1.weight"),
    (lambda c: c["optimizer"]["state"]["0"].update(exp_avg=np.array(0.5, np.float32)), "optimizer.state.0.exp_avg"),
    (lambda c: c["progress"]["sums"].update(seen=10 ** 6), "progress"),
])
def test_a_checkpoint_with_wrong_content_names_the_first_wrong_entry(finished_run, data_dir, capsys, damage, named):
    line = _resume_with(finished_run, data_dir, capsys, damage)
    assert named in line


def test_nan_weights_are_refused_by_evaluate_and_stop_a_resumed_run_keeping_the_checkpoint(finished_run, data_dir,
                                                                                           capsys):
    path = finished_run / "checkpoints" / "last.npz"
    checkpoint = tc.load(path)
    checkpoint["model"]["conv1.weight"][0] = np.nan
    tc.save(checkpoint, path)
    before = path.read_bytes()
    for command in (["evaluate", "--checkpoint", str(path), "--data-dir", str(data_dir), "--device", "cpu"],
                    ["gradflow", "--checkpoint", str(path), "--data-dir", str(data_dir), "--device", "cpu",
                     "--batches", "1", "--batch-size", "2"]):
        line, out = one_line_error(capsys, cli.main(command))
        assert "non-finite" in line and "conv1.weight" in line and "accuracy" not in out
    status = cli.main(train_args(data_dir, finished_run, "--epochs", "2", "--resume"))
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and "non-finite" in err.strip().splitlines()[-1]
    assert path.read_bytes() == before  # the last good checkpoint is kept


def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    line, _ = one_line_error(capsys, cli.main(["evaluate", "--checkpoint", str(tmp_path / "none.npz")]))
    assert "none.npz" in line


def test_evaluate_refuses_weights_stored_as_strings(finished_run, tmp_path, capsys):
    checkpoint = tc.load(finished_run / "checkpoints" / "best.npz")
    checkpoint["model"] = {k: v.astype(str) for k, v in checkpoint["model"].items()}
    tc.save(checkpoint, tmp_path / "strings.npz")
    line, _ = one_line_error(capsys, cli.main(["evaluate", "--checkpoint", str(tmp_path / "strings.npz")]))
    assert "floating-point" in line


def test_stale_temporaries_are_removed_at_resume(finished_run, data_dir):
    stale = finished_run / "checkpoints" / ".tmp-stale.npz"
    stale.write_bytes(b"x" * 1000)
    assert cli.main(train_args(data_dir, finished_run, "--epochs", "2", "--resume")) == 0
    assert not stale.exists()


# --- bad input that used to be accepted silently

@pytest.mark.parametrize("option, value", [("--lr", "nan"), ("--lr", "inf"), ("--lr", "1e308"), ("--lr", "-1"),
                                           ("--lr-decay", "nan"), ("--lr-decay", "-1"), ("--lr-decay", "0"),
                                           ("--reconstruction-weight", "nan"), ("--reconstruction-weight", "-1"),
                                           ("--seed", "-1"), ("--routing-iterations", "1000000")])
def test_out_of_range_values_are_refused(data_dir, tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as info:
        cli.main(train_args(data_dir, tmp_path / "run", f"{option}={value}"))
    err = capsys.readouterr().err
    assert info.value.code == 2 and option in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_labels_outside_a_known_datasets_classes_are_refused(tmp_path, capsys):
    def too_many(stem, n):
        return (np.arange(n) % 12).astype(np.uint8)

    data = make_dataset(tmp_path / "data", name="fashion-mnist", labels_of=too_many, size=28)
    line, _ = one_line_error(capsys, cli.main(train_args(data / "fashion-mnist", tmp_path / "run",
                                                         dataset="fashion-mnist")))
    assert "11" in line


def test_float_labels_and_missing_classes_are_refused(tmp_path, capsys):
    data = make_dataset(tmp_path / "floats", label_dtype=np.float32)
    line, _ = one_line_error(capsys, cli.main(train_args(data, tmp_path / "run")))
    assert "integers" in line

    def gap(stem, n):
        return np.where(np.arange(n) % 2 == 0, 0, 2).astype(np.uint8)  # class 1 never occurs

    data = make_dataset(tmp_path / "gap", labels_of=gap)
    line, _ = one_line_error(capsys, cli.main(train_args(data, tmp_path / "run")))
    assert "1" in line and "never occur" in line


def test_the_class_count_and_data_folder_are_printed(data_dir, tmp_path, capsys):
    assert cli.main(train_args(data_dir, tmp_path / "run", "--epochs", "1")) == 0
    out = capsys.readouterr().out
    assert f"from {data_dir / 'tiny'}" in out and "3 classes" in out


def test_an_incomplete_user_folder_is_an_error_not_a_fallback(tmp_path, capsys):
    data = make_dataset(tmp_path / "data", name="fashion-mnist")
    os.remove(data / "fashion-mnist" / "t10k-labels-idx1-ubyte")
    line, _ = one_line_error(capsys, cli.main(train_args(data, tmp_path / "run", dataset="fashion-mnist")))
    assert "t10k-labels-idx1-ubyte" in line and "only part" in line


def test_an_unreadable_candidate_folder_does_not_stop_the_search(tmp_path, monkeypatch):
    from tinygrad_caps.data import mnist

    make_dataset(tmp_path / "cache", name="tiny")
    monkeypatch.setenv("TINYGRAD_CAPS_DATA", str(tmp_path / "cache"))
    real = mnist._find_file

    def locked(folder, stem):
        if folder == tmp_path / "locked":
            raise PermissionError(errno.EACCES, "Permission denied", str(folder))
        return real(folder, stem)

    monkeypatch.setattr(mnist, "_find_file", locked)
    assert mnist.find_dataset_dir("tiny", tmp_path / "locked") == tmp_path / "cache" / "tiny"


def test_a_batch_larger_than_the_training_set_is_checked_at_the_images_the_data_holds(data_dir, tmp_path,
                                                                                        monkeypatch):
    """The memory check before data reads the training set's size from its files' header (40 images
    here), so a --batch-size far above it trains as it always did, and the estimate never sees more."""
    from tinygrad_caps.models.app.training import resources

    batches = []
    real = resources.check_fits
    monkeypatch.setattr(preflight, "check_fits", lambda options, batch, *a, **k: (batches.append(batch),
                                                                                  real(options, batch, *a, **k)))
    assert cli.main(train_args(data_dir, tmp_path / "run", "--batch-size", "2147483648")) == 0
    assert batches == [40]
    assert cli.main(train_args(data_dir, tmp_path / "limited", "--batch-size", "2147483648",
                               "--limit-train", "24")) == 0
    assert batches == [40, 24]


def test_an_image_folder_counts_its_images_without_reading_them(tmp_path):
    from tinygrad_caps.data import dataset_spec

    for split, count in (("train", 3), ("test", 2)):
        for label in ("a", "b"):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for k in range(count):
                (folder / f"{k}.png").write_bytes(b"not an image: counting reads no image")
    spec = dataset_spec("imagefolder", tmp_path)
    assert (spec.image_count("train", tmp_path), spec.image_count("test", tmp_path)) == (6, 4)
