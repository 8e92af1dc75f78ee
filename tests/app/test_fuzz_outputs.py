"""A fuzz suite for what the CLI reads back and draws: damaged run logs (``metrics.jsonl``,
``gradflow.jsonl``) through ``plot``, and output paths (suffixes, none, folders, unwritable places,
names too long) through ``plot --out`` and ``evaluate --reconstructions``, on a tiny run trained here.

The property, for every case: exit status 0 and every file printed as ``written: PATH`` exists
(the picture among them), or exit status 2 with exactly one line on stderr, no traceback, and no
picture; a case known to be valid must succeed and one known to be invalid must be refused (some
damage, such as random bytes, may be either).

Each family draws ``FACTOR`` times the profile's ``max_examples`` (12 by default: 48 per family).
"""
import contextlib
import io
import json
import math
import os
import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cli_fuzz import TINY, VALID_FILES, assert_clean_ending, run, write_dataset
from tinygrad_caps.models import cli

pytest.importorskip("matplotlib")

FACTOR = 4
EXAMPLES = settings.default.max_examples * FACTOR
METRIC_KEYS = ("epoch", "train_loss", "test_loss", "train_accuracy", "test_accuracy")
ITERATION_KEYS = ("coupling_entropy", "grad_norm_sum", "grad_norm_agreement")
WRONG_TYPES = st.one_of(st.text(max_size=5), st.lists(st.integers(), max_size=2), st.just({}), st.booleans())
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny CapsNet run of two epochs with every step's gradient flow logged."""
    root = tmp_path_factory.mktemp("fuzz-outputs")
    data_dir = write_dataset(root, VALID_FILES)
    out = root / "run"
    assert run(["train", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--epochs", "2",
                "--log-gradflow", "1"])[0] == 0
    logs = {name: [json.loads(line) for line in (out / name).read_text().splitlines()]
            for name in ("metrics.jsonl", "gradflow.jsonl")}
    assert len(logs["metrics.jsonl"]) == 2 and len(logs["gradflow.jsonl"]) == 2
    return {"run": out, "data_dir": data_dir, "logs": logs, "checkpoint": out / "checkpoints" / "last.npz"}


def run_capturing(argv):
    """(exit status, stdout, stderr) of ``cli.main(argv)``, argparse's SystemExit included."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, out.getvalue(), err.getvalue()


def is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system
        return False


def written(stdout) -> list:
    return [Path(line[len("written: "):]) for line in stdout.splitlines() if line.startswith("written: ")]


def check_outcome(status, stdout, err, expected, picture: Path):
    """The fuzz property; ``expected`` True (must succeed), False (must be refused) or None (either)."""
    assert_clean_ending(status, err, valid=status == 0 and expected is not False)
    if status == 0:
        assert expected is not False, f"invalid input accepted: {stdout}"
        assert picture in written(stdout) and all(is_file(path) for path in written(stdout)), stdout
    else:
        assert expected is not True, f"valid input refused: {err}"
        assert not is_file(picture)


# --- damaged logs ---

def _iteration_paths(line):
    return [(k, r) for k, layer in enumerate(line["layers"]) for r in range(len(layer["iterations"]))]


@st.composite
def damaged_logs(draw, logs):
    """(files as name -> bytes, expected validity, what was done) from a run's valid log lines."""
    lines = {name: [json.loads(json.dumps(x)) for x in values] for name, values in logs.items()}
    name = draw(st.sampled_from(sorted(lines)))
    k = draw(st.integers(0, len(lines[name]) - 1))
    line = lines[name][k]
    kinds = ["none", "extra key", "unused key", "bytes", "truncate", "top level", "wrong type", "missing key",
             "non-finite"] + (["ragged", "no layers"] if name == "gradflow.jsonl" else [])
    kind = draw(st.sampled_from(kinds))
    expected, raw_line = True, None
    if kind == "extra key":
        line["note"] = draw(st.one_of(WRONG_TYPES, st.none()))
    elif kind == "unused key":
        line["mode" if name == "gradflow.jsonl" else "seconds"] = draw(st.one_of(WRONG_TYPES, st.none()))
    elif kind == "bytes":
        raw_line, expected = draw(st.binary(min_size=1, max_size=24)).replace(b"\n", b"\x00"), None
    elif kind == "truncate":
        text = json.dumps(line).encode()
        raw_line, expected = text[:draw(st.integers(1, len(text) - 1))], False
    elif kind == "top level":
        raw_line, expected = json.dumps(draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(),
                                                       st.text(max_size=4), st.none()))).encode(), False
    elif name == "metrics.jsonl":
        key, expected = draw(st.sampled_from(METRIC_KEYS)), False
        if kind == "missing key":
            del line[key]
        else:
            line[key] = draw(WRONG_TYPES if kind == "wrong type" else NON_FINITE)
    else:
        expected = False
        if kind in ("ragged", "no layers"):
            if kind == "no layers":
                del line["layers"]
            else:
                line["layers"][0]["iterations"].pop()
        else:
            layer, r = draw(st.sampled_from(_iteration_paths(line)))
            target = draw(st.sampled_from(ITERATION_KEYS + ("step", "layers", "iterations")))
            holder = line if target in ("step", "layers") else line["layers"][layer]
            if target in ITERATION_KEYS:
                holder = holder["iterations"][r]
            if kind == "missing key":
                del holder[target]
            elif kind == "wrong type":
                holder[target] = draw(WRONG_TYPES)
            else:
                holder[target] = draw(NON_FINITE) if target in ITERATION_KEYS else draw(st.sampled_from([0, -1]))
    if raw_line is None:
        raw_line = json.dumps(line).encode()
    files = {}
    for each, values in lines.items():
        encoded = [json.dumps(x).encode() for x in values]
        if each == name:
            encoded[k] = raw_line
        text = b"\n".join(encoded)
        files[each] = text if draw(st.booleans()) else text + b"\n"  # a last line with or without its end
    return files, expected, f"{name} {kind}"


@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_plot_of_damaged_logs_ends_in_one_line_or_a_picture(trained, data):
    files, expected, what = data.draw(damaged_logs(trained["logs"]))
    event(what.split(" ", 1)[1])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        folder.mkdir()
        for name, raw in files.items():
            (folder / name).write_bytes(raw)
        picture = Path(tmp) / "plot.png"
        status, stdout, err = run_capturing(["plot", str(folder), "--out", str(picture)])
        check_outcome(status, stdout, err, expected, picture)
        if status == 2 and expected is False:
            assert "line" in err and ("metrics.jsonl" in err or "gradflow.jsonl" in err), err


# --- output paths ---

STEMS = st.text(alphabet=string.ascii_letters + string.digits + "-_ ", min_size=1, max_size=10).filter(str.strip)
SUFFIXES = st.sampled_from([".png", ".PNG", ".pdf", ".svg", ".Svg", ".tar.png", ".jpg", ".xyz", ".json", "",
                            ".png.txt"])
PLACES = st.sampled_from(["plain", "missing folders", "existing folder", "under a file", "name too long",
                          "trailing slash", "read-only folder"])


def output_path(root: Path, stem: str, suffix: str, place: str):
    """(the path as typed, the picture it names, expected validity) for a drawn case, made under ``root``."""
    good = suffix.lower().rsplit(".", 1)[-1] in ("png", "pdf", "svg") and bool(suffix)
    name = stem + suffix
    if place == "plain":
        path = root / name
    elif place == "missing folders":
        path = root / "a" / "b" / name
    elif place == "existing folder":
        path = root / name
        path.mkdir()
        return str(path), path, False
    elif place == "under a file":
        (root / "file.txt").write_text("")
        path = root / "file.txt" / name
        return str(path), path, False
    elif place == "read-only folder":
        path = root / "locked" / name
        path.parent.mkdir()
        path.parent.chmod(0o555)
        return str(path), path, None if os.geteuid() == 0 else False  # root writes there all the same
    elif place == "name too long":
        path = root / (stem * 300 + suffix)
        return str(path), path, False
    else:
        path = root / name
        return str(path) + "/", path, False
    return str(path), path, good


@settings(max_examples=EXAMPLES)
@given(stem=STEMS, suffix=SUFFIXES, place=PLACES, command=st.sampled_from(["plot", "evaluate"]))
def test_output_paths_end_in_one_line_or_the_named_file(trained, stem, suffix, place, command):
    event(f"{command} {place}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        typed, picture, expected = output_path(root, stem, suffix, place)
        before = sorted(root.rglob("*"))
        if command == "plot":
            argv = ["plot", str(trained["run"]), "--out", typed]
        else:
            argv = ["evaluate", "--checkpoint", str(trained["checkpoint"]), "--data-dir", str(trained["data_dir"]),
                    "--reconstructions", typed]
        try:
            status, stdout, err = run_capturing(argv)
        finally:
            if (root / "locked").exists():
                (root / "locked").chmod(0o755)
        check_outcome(status, stdout, err, expected, picture)
        if status == 0:
            sidecar = [picture.with_suffix(".json")] if command == "evaluate" else []
            assert written(stdout) == [picture, *sidecar]  # the real names: a suffix is never added
        else:
            assert sorted(root.rglob("*")) == before  # refused before any work: nothing created
            assert stdout == ""  # evaluate has not printed its evaluation
