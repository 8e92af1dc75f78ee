"""The tiny IDX dataset and the fuzz property shared by the CLI fuzz suites (app/test_fuzz_cli.py,
app/test_fuzz_outputs.py, data/test_fuzz_data.py): a valid dataset "tiny" and the CapsNet small
enough for it, ``cli.main`` run in-process, and the property every case must end by."""
import contextlib
import io
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import event

from tinygrad_caps.data import write_idx
from tinygrad_caps.models import cli

SIZE, KERNEL, TRAIN, TEST, CLASSES = 8, 3, 12, 6, 3
TINY = ["--dataset", "tiny", "--conv1-channels", "2", "--primary-types", "1", "--primary-dim", "2", "--digit-dim",
        "2", "--kernel-size", str(KERNEL), "--decoder-hidden", "16,32", "--batch-size", "12", "--epochs", "1",
        "--no-progress", "--device", "cpu"]


def idx_dataset_files() -> dict:
    """The four IDX files (name -> bytes) of a valid dataset; the images ones gzip-compressed."""
    rng = np.random.default_rng(0)
    files = {}
    for prefix, n in (("train", TRAIN), ("t10k", TEST)):
        labels = (np.arange(n) % CLASSES).astype(np.uint8)
        images = (rng.random((n, SIZE, SIZE)) * 255).astype(np.uint8)
        with tempfile.TemporaryDirectory() as folder:
            write_idx(Path(folder) / "i", images, compress=True)
            write_idx(Path(folder) / "l", labels)
            files[f"{prefix}-images-idx3-ubyte.gz"] = (Path(folder) / "i").read_bytes()
            files[f"{prefix}-labels-idx1-ubyte"] = (Path(folder) / "l").read_bytes()
    return files


VALID_FILES = idx_dataset_files()


def run(argv):
    """(exit status, stderr) of ``cli.main(argv)``, argparse's SystemExit included."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = cli.main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue()


def assert_clean_ending(status, err, valid: bool):
    """The fuzz property: 0 on valid input; 2, one line, no traceback otherwise."""
    event(f"exit {status}")
    assert "Traceback" not in err, err
    if valid:
        assert status == 0, f"valid input refused: {err}"
    else:
        assert status == 2, f"invalid input ended with {status}: {err}"
        lines = err.strip().splitlines()
        assert len(lines) == 1, err


def write_dataset(root: Path, files: dict) -> Path:
    folder = root / "tiny"
    folder.mkdir(parents=True)
    for name, raw in files.items():
        (folder / name).write_bytes(raw)
    return root
