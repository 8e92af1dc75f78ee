"""A fuzz suite for the CLI: corrupted IDX files, corrupted checkpoints and option values at and
beyond their ranges, each run through ``cli.main([...])`` in-process (a few through the console
script). The property, for every case: exit status 0 on valid input, else 2 with exactly one line on
stderr and no traceback; never a silent success on invalid input; and a `train` that fails before
its first batch creates no run folder.

Each of the five generated families draws ``FACTOR`` times the profile's ``max_examples`` (12 by
default: 60 per family, 300 in all, plus 4 console-script cases; ``HYPOTHESIS_PROFILE=long``: 1,500
per family). ``pytest --hypothesis-show-statistics`` shows how each family
ended (the ``exit`` events).
"""
import gzip
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import tinygrad_caps as tc
from cli_fuzz import KERNEL, TINY, VALID_FILES, assert_clean_ending, run, write_dataset

FACTOR = 5
EXAMPLES = settings.default.max_examples * FACTOR
STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


# --- an independent oracle for IDX datasets (mirrors the rules of docs/data.md and docs/reliability.md, not the loader's code) ---

IDX_DTYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def decode_idx(raw: bytes):
    """The array an IDX file holds, or None if it is not a valid (possibly gzipped) IDX file."""
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except Exception:  # noqa: BLE001  (any failure means: not valid)
            return None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES or raw[3] == 0:
        return None
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        return None
    shape = tuple(int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    if len(raw) != 4 + 4 * ndim + math.prod(shape) * dtype.itemsize:
        return None
    return np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim).reshape(shape)


def dataset_is_valid(files: dict) -> bool:
    """Whether `train` must accept these four files as dataset "tiny" with the TINY model."""
    arrays = {}
    for name, raw in files.items():
        array = decode_idx(raw)
        if array is None:
            return False
        arrays[name.removesuffix(".gz")] = array
    train_x, train_y, test_x, test_y = (arrays[stem] for stem in STEMS)
    for x, y in ((train_x, train_y), (test_x, test_y)):
        if x.dtype != np.uint8 or x.ndim not in (3, 4) or y.ndim != 1 or y.dtype.kind not in "iu":
            return False
        if len(x) != len(y) or len(y) == 0 or x.shape[-1] != x.shape[-2]:
            return False
    channels = lambda x: 1 if x.ndim == 3 else x.shape[1]  # noqa: E731
    if channels(train_x) != channels(test_x) or train_x.shape[-1] != test_x.shape[-1] or channels(train_x) == 0:
        return False
    size = train_x.shape[-1]
    if size - KERNEL + 1 < KERNEL:  # two 3x3 convolutions (the second with stride 2) need 5x5 images
        return False
    if train_y.min() < 0 or test_y.min() < 0:
        return False
    k = int(train_y.max()) + 1
    if k < 2 or len(np.unique(train_y)) != k or test_y.max() >= k:
        return False
    return True


@st.composite
def corrupted_dataset(draw):
    """The valid files with one of them truncated, bit-flipped, or given another header field."""
    files = dict(VALID_FILES)
    name = draw(st.sampled_from(sorted(files)))
    raw = files[name]
    kind = draw(st.sampled_from(["truncate", "flip", "header", "label"] if "labels" in name
                                else ["truncate", "flip", "header", "pixel"]))
    event(f"idx {kind}")
    if kind == "truncate":
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif kind == "flip":
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
    else:
        plain = bytearray(gzip.decompress(raw) if name.endswith(".gz") else raw)
        if kind == "header":
            field = draw(st.integers(2, len(plain[:4 + 4 * plain[3]]) - 1))
            plain[field] = draw(st.integers(0, 255).filter(lambda b: b != plain[field]))
        else:  # a label or pixel changed to any byte value (a label may leave 0..K-1 or remove a class)
            at = draw(st.integers(4 + 4 * plain[3], len(plain) - 1))
            plain[at] = draw(st.integers(0, 255))
        raw = gzip.compress(bytes(plain)) if name.endswith(".gz") else bytes(plain)
    files[name] = raw
    return files


@settings(max_examples=EXAMPLES)
@given(corrupted_dataset())
def test_corrupted_idx_files_end_in_one_line_or_train(files):
    with tempfile.TemporaryDirectory() as tmp:
        data = write_dataset(Path(tmp) / "data", files)
        out = Path(tmp) / "run"
        status, err = run(["train", *TINY, "--data-dir", str(data), "--out", str(out)])
        valid = dataset_is_valid(files)
        assert_clean_ending(status, err, valid)
        assert out.exists() == valid  # a run that failed before its first batch leaves no folder


# --- option values at and beyond their ranges ---

FLOAT_TEXT = st.one_of(st.sampled_from(["nan", "inf", "-inf", "1e308", "-1", "0", "1", "1e-300", "abc", "", "0x10"]),
                       st.floats(allow_nan=True, allow_infinity=True).map(repr))
INT_TEXT = st.one_of(st.sampled_from(["-1", "0", "1", "2", "3", "4", "5", "100", "101", "2147483648",
                                      "9223372036854775807", "9223372036854775808", "1.5", "x", ""]),
                     st.integers(-10, 10).map(str))
# Sizes are tiny or beyond any machine (10^9 primary dims: 10^11 bytes of weights), never in between.
SIZE_TEXT = st.sampled_from(["1", "2", "3", "0", "-3", "1000000000", "100000000000", "1e3", "two"])


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def _integer(text):
    try:
        return int(text)
    except ValueError:
        return None


def option_is_valid(option, text) -> bool:
    """The documented range of each option (docs/reliability.md, "Bad input")."""
    if option in ("--lr", "--lr-decay"):
        value = _number(text)
        return value is not None and math.isfinite(value) and 0 < value <= 1
    if option == "--reconstruction-weight":
        value = _number(text)
        return value is not None and math.isfinite(value) and 0 <= value <= 1000
    value = _integer(text)
    if value is None:
        return False
    if option == "--seed":
        return 0 <= value <= 2 ** 63 - 1
    if option == "--routing-iterations":
        return 1 <= value <= 100
    if option == "--kernel-size":  # 8x8 images take two convolutions up to 4x4
        return 1 <= value <= 4
    if option in ("--conv1-channels", "--primary-types", "--primary-dim", "--digit-dim"):
        return 1 <= value <= 3  # the drawn sizes are tiny or far beyond any machine
    return value >= 1  # --epochs, --batch-size, --limit-test


OPTION_VALUES = st.one_of(
    st.tuples(st.sampled_from(["--lr", "--lr-decay", "--reconstruction-weight"]), FLOAT_TEXT),
    st.tuples(st.sampled_from(["--seed", "--routing-iterations", "--kernel-size", "--limit-train", "--limit-test",
                               "--batch-size", "--epochs"]), INT_TEXT),
    st.tuples(st.sampled_from(["--conv1-channels", "--primary-types", "--primary-dim", "--digit-dim"]), SIZE_TEXT),
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("fuzz"), VALID_FILES)


@settings(max_examples=EXAMPLES)
@given(st.lists(OPTION_VALUES, min_size=1, max_size=2, unique_by=lambda pair: pair[0]))
def test_option_values_at_and_beyond_their_ranges(data_dir, options):
    valid = all(option_is_valid(option, text) for option, text in options)
    if valid and any(o == "--epochs" and int(t) > 2 for o, t in options):
        options = [(o, "2" if o == "--epochs" else t) for o, t in options]  # keep valid runs short
    event("valid" if valid else "invalid")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = ["train", *TINY, "--data-dir", str(data_dir), "--out", str(out)]
        for option, text in options:
            argv += [f"{option}={text}"]  # "=" keeps values such as "-1" from reading as options
        status, err = run(argv)
        assert_clean_ending(status, err, valid)
        assert out.exists() == valid


# --- corrupted checkpoints: for --resume and for evaluate ---

@pytest.fixture(scope="module")
def finished_run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "run"
    assert run(["train", *TINY, "--data-dir", str(data_dir), "--out", str(out)])[0] == 0
    return out


def _leaves(tree, path=()):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, path + (key,))
    yield path, tree


# Which parts of a checkpoint --resume reads (the rest of config is the command line's business).
RESUME_READS = ("model", "optimizer", "scheduler", "rng", "progress")
CONFIG_READ = ("in_channels", "image_size", "num_classes", "routing_iterations", "routing_gradient", "decoder",
               "conv1_channels", "primary_types", "primary_dim", "digit_dim", "kernel_size")


def _read_on_resume(path) -> bool:
    return bool(path) and (path[0] in RESUME_READS or (path[0] == "config" and len(path) == 2
                                                       and path[1] in CONFIG_READ))


def _invalid_replacements(value):
    """Values of another type, dtype, shape or range than ``value`` (each one invalid in its place)."""
    if isinstance(value, np.ndarray):
        return [value.astype(np.int64), value.astype(np.complex64), value.astype(str), value.reshape(-1)[:1].reshape(()),
                np.zeros(value.shape + (2,), value.dtype), "x"]
    if isinstance(value, dict):
        return ["x", None, [1, 2]]
    if isinstance(value, bool):
        return ["yes", 3, None]
    if isinstance(value, int):
        return ["1", -1, 1.5, None, [value]]
    if isinstance(value, float):
        return ["0.5", float("nan"), float("inf"), None]
    if isinstance(value, str):
        return [3, "bogus", None]
    if isinstance(value, (list, tuple)):
        return ["x", list(value) + [0.5], []]
    return ["x"]


@st.composite
def damaged_tree(draw, checkpoint):
    """The checkpoint with one entry that --resume reads deleted, retyped, or joined by an unknown key."""
    paths = [path for path, _ in _leaves(checkpoint) if _read_on_resume(path)]
    path = draw(st.sampled_from(paths))
    parent = checkpoint
    for key in path[:-1]:
        parent = parent[key]
    value = parent[path[-1]]
    kind = draw(st.sampled_from(["delete", "retype", "unknown key"] if isinstance(value, dict) and path[0] in
                                ("scheduler", "rng", "progress") else ["delete", "retype"]))
    event(f"checkpoint {kind}")
    damaged = _copy(checkpoint)
    target = damaged
    for key in path[:-1]:
        target = target[key]
    if kind == "delete":
        if path[0] == "optimizer" and len(path) == 4:  # a whole Adam state may be absent (no step yet)
            del target[path[-1]]
            target.clear()
        else:
            del target[path[-1]]
    elif kind == "retype":
        target[path[-1]] = draw(st.sampled_from(_invalid_replacements(value)))
    else:
        target[path[-1]]["base_lr_overwritten"] = 1.0
    return damaged


def _copy(tree):
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    return tree.copy() if isinstance(tree, np.ndarray) else tree


@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_checkpoints_with_wrong_content_are_refused_on_resume(finished_run, data_dir, data):
    checkpoint = tc.load(finished_run / "checkpoints" / "last.npz")
    damaged = data.draw(damaged_tree(checkpoint))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        shutil.copytree(finished_run, out)
        tc.save(damaged, out / "checkpoints" / "last.npz")
        status, err = run(["train", *TINY[:-1], "2", "--data-dir", str(data_dir), "--out", str(out), "--resume"])
        assert_clean_ending(status, err, valid=False)


@st.composite
def damaged_bytes(draw, raw):
    if draw(st.booleans()):
        event("checkpoint truncated")
        return raw[:draw(st.integers(0, len(raw) - 1))], False
    event("checkpoint byte flipped")
    at = draw(st.integers(0, len(raw) - 1))
    return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:], None


@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_damaged_checkpoint_files_end_in_one_line_or_load(finished_run, data_dir, data):
    raw = (finished_run / "checkpoints" / "last.npz").read_bytes()
    damaged, valid = data.draw(damaged_bytes(raw))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "last.npz"
        path.write_bytes(damaged)
        status, err = run(["evaluate", "--checkpoint", str(path), "--data-dir", str(data_dir), "--device", "cpu"])
        if valid is None:  # a flip the zip's CRCs cannot see (a name or time field) may still load
            valid = status == 0
        assert_clean_ending(status, err, valid)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=12)
TREE_NODES = st.recursive(st.builds(lambda v: {"value": v}, JSON) | st.builds(lambda k: {"array": k}, st.text(max_size=3)),
                          lambda inner: st.builds(lambda items: {"dict": items},
                                                  st.lists(st.tuples(st.text(max_size=8) | st.integers(), inner),
                                                           max_size=4))
                          | st.builds(lambda items: {"list": items}, st.lists(inner, max_size=3)),
                          max_leaves=10)


@settings(max_examples=EXAMPLES)
@given(tree=st.one_of(JSON, TREE_NODES))
def test_a_forged_structure_record_ends_in_one_line(data_dir, tree):
    """The JSON record inside a checkpoint that says how to rebuild the nesting, replaced by anything."""
    import json

    from tinygrad_caps.serialization import FORMAT, META_KEY

    meta = json.dumps({"format": FORMAT, "version": 1, "tree": tree}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "forged.npz"
        np.savez(path, **{META_KEY: np.frombuffer(meta, dtype=np.uint8), "a0": np.zeros(3, np.float32)})
        status, err = run(["evaluate", "--checkpoint", str(path), "--data-dir", str(data_dir), "--device", "cpu"])
        assert_clean_ending(status, err, valid=False)


# --- a few cases through the console script ---

def _console_script():
    script = shutil.which("tinygrad-caps")
    return [script] if script else [sys.executable, "-m", "tinygrad_caps.models.cli"]


@pytest.mark.parametrize("case", ["corrupt idx", "bad lr", "huge model", "damaged checkpoint"])
def test_console_script_ends_with_one_line(case, data_dir, finished_run, tmp_path):
    argv = ["train", *TINY, "--data-dir", str(data_dir), "--out", str(tmp_path / "run")]
    if case == "corrupt idx":
        files = dict(VALID_FILES, **{"train-labels-idx1-ubyte": VALID_FILES["train-labels-idx1-ubyte"][:-3]})
        argv[argv.index("--data-dir") + 1] = str(write_dataset(tmp_path / "data", files))
    elif case == "bad lr":
        argv += ["--lr", "nan"]
    elif case == "huge model":
        argv += ["--conv1-channels", "1000000000"]
    else:
        damaged = tmp_path / "damaged.npz"
        damaged.write_bytes((finished_run / "checkpoints" / "last.npz").read_bytes()[:5000])
        argv = ["evaluate", "--checkpoint", str(damaged), "--data-dir", str(data_dir)]
    env = dict(os.environ, TINYGRAD_CAPS_DEVICE="cpu")
    result = subprocess.run(_console_script() + argv, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()
