"""The command line's behaviour as files, for comparing two trees byte for byte: every command's exit
status, stdout and stderr, and every file it writes, with only what varies from run to run masked.

    python tests/support/behaviour_snapshot.py OUT            # OUT must not exist; takes a few minutes
    diff -r BEFORE OUT                                        # two trees' snapshots: only deliberate changes

It writes a tiny striped dataset itself (``cli_helpers.tiny_data_dir``) in a scratch folder, runs each
command there as ``tinygrad-caps`` (a process of its own, on the CPU, one engine thread) with paths
relative to that folder, and writes

    OUT/steps/NN-name/argv, exit, stdout, stderr    each command, in the order it ran
    OUT/files/<path>                                every file the commands left, in the scratch folder's layout

Masked, as ``<...>``: wall-clock seconds (metrics' and checkpoints' "seconds", an epoch line's and a
progress line's times), ISO times, process ids, the host name, the scratch folder's absolute path and
TensorBoard event files' names (their time and host). Files are kept as written except: a checkpoint
(.npz) becomes ``<name>.npz.txt``, each member's SHA-256 and the metadata's text; a TensorBoard event
file becomes ``<name>.txt``, its tags of each kind sorted, each scalar tag's steps and values (the
interval rate ``train/images_per_second`` and metrics' ``seconds`` only as steps) and each other
tag's steps. PNG files are kept byte for byte (matplotlib writes the same bytes for the same drawing
calls; a second run of this script on the same tree shows it). The stdout of a study run with
``--jobs 2`` has its lines sorted and its progress lines but the last left out: two workers'
lines interleave as they happen to finish, and which runs such a line names, how many it counts
left and its estimate of the time left depend on timing (the last one, "N finished, 0 running, 0
left", is kept).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
sys.path.insert(0, str(SUPPORT))

from cli_helpers import TINY_CPU, tiny_data_dir  # noqa: E402

ENTRY = "import sys, tinygrad_caps_cli; sys.exit(tinygrad_caps_cli.main())"
DATA = ["--dataset", "tiny", "--data-dir", "data"]
TINY_TRAIN = ["train", *DATA, *TINY_CPU]
SMALL_MODEL = ["--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4", "--digit-dim", "4",
               "--kernel-size", "3"]
# every step logged, so that the study's figures have values
STUDY = ["study", "run", "gradient-modes", "--seed-list", "0", "--epochs", "1", "--log-gradflow", "1", *DATA, *TINY_CPU]
TIME_TAGS = ("train/images_per_second", "epoch/seconds")
SORTED = "sorted"
# a parallel study's progress lines but its last: which runs one names, how many it counts left
# (between one run's end and the next one's start) and its estimate of the time left depend on timing
RUNNING = re.compile(r"study: \d+ finished, (?!0 running, (\d+ failed, )?0 left\n)")


def steps():
    """[(name, argv, how)]: the commands in the order they run; ``how`` is None, SORTED (stdout's lines
    sorted, without the progress lines but the last), a callable run on the scratch folder before
    the command, or a tuple of both."""
    return [
        ("help", ["--help"], None),
        *[(f"help-{name.replace(' ', '-')}", [*name.split(), "--help"], None)
          for name in ("train", "study", "study run", "study summary", "study list", "evaluate", "visualize",
                       "gradflow", "graph", "plot")],
        ("train", [*TINY_TRAIN, "--out", "run", "--epochs", "1", "--log-gradflow", "1", "--log-mode-cosine",
                   "--tensorboard"], None),
        ("train-resume", ["train", "--resume", "--out", "run", "--epochs", "2", "--no-progress"], None),
        ("train-hidden", [*TINY_TRAIN, "--out", "run-hidden", "--epochs", "1", "--hidden-capsules", "3x3",
                          "--routing-gradient", "detach", "--log-gradflow", "2"], None),
        ("refuse-lr", [*TINY_TRAIN, "--out", "refused", "--lr", "2"], None),
        ("refuse-conv1-channels", [*TINY_TRAIN, "--out", "refused", "--conv1-channels", "0"], None),
        ("refuse-resume-empty", ["train", "--resume", "--out", "empty", "--no-progress"], _make_empty),
        ("refuse-em-capsule-bias", [*TINY_TRAIN, "--out", "refused", "--routing", "em", "--capsule-bias"], None),
        ("refuse-one-step-detach", [*TINY_TRAIN, "--out", "refused", "--routing", "self-attention",
                                    "--routing-gradient", "detach"], None),
        ("refuse-one-step-mode-cosine", [*TINY_TRAIN, "--out", "refused", "--routing", "self-attention",
                                         "--log-gradflow", "1", "--log-mode-cosine"], None),
        ("plot", ["plot", "run", "--tensorboard-out", "run-export"], None),
        ("plot-hidden", ["plot", "run-hidden"], None),
        ("gradflow", ["gradflow", "--checkpoint", "run/checkpoints/last.npz", "--data-dir", "data", "--batches", "2",
                      "--batch-size", "8", "--device", "cpu", "--out", "gradflow-run", "--no-progress"], None),
        ("gradflow-fresh", ["gradflow", *DATA, "--batches", "1", "--batch-size", "8", "--device", "cpu",
                            "--out", "gradflow-fresh", "--hidden-capsules", "3x3", *SMALL_MODEL,
                            "--hessian-iterations", "2"], None),
        ("refuse-gradflow-unknown-mode", ["gradflow", *DATA, *SMALL_MODEL, "--modes", "full,sideways", "--out",
                                          "refused"], None),
        ("refuse-gradflow-one-step-detach", ["gradflow", *DATA, *SMALL_MODEL, "--routing", "self-attention",
                                             "--modes", "detach", "--out", "refused"], None),
        ("study-list", ["study", "list"], None),
        ("study-jobs1", [*STUDY, "--out", "study-jobs1", "--no-progress", "--tensorboard-out", "study-tb"], None),
        ("study-jobs2", [*STUDY, "--out", "study-jobs2", "--no-progress", "--jobs", "2", "--threads-per-run", "1"],
         SORTED),
        ("study-max-minutes", [*STUDY, "--out", "study-stopped", "--no-progress", "--max-minutes", "1e-9"], None),
        ("study-summary-stopped", ["study", "summary", "study-stopped"], None),
        ("study-failing-jobs1", ["study", "run", "gradient-modes", "--out", "study-failing1", "--resume",
                                 "--epochs", "2", "--no-progress"], _failing_copy("study-failing1")),
        ("study-failing-jobs2", ["study", "run", "gradient-modes", "--out", "study-failing2", "--resume",
                                 "--epochs", "2", "--no-progress", "--jobs", "2", "--threads-per-run", "1"],
         (_failing_copy("study-failing2"), SORTED)),
        ("study-depth", ["study", "run", "depth", "--max-depth", "1", "--seed-list", "0", "--epochs", "1",
                         "--log-gradflow", "1", *DATA, *TINY_CPU, "--out", "study-depth"], None),
        ("study-summary", ["study", "summary", "study-jobs1"], _forget_summary("study-jobs1")),
        ("plot-study-run", ["plot", "study-jobs1/runs/routing3-full/seed-0"], None),
        ("refuse-study-nested", [*STUDY, "--out", "run/study"], None),
    ]


def _make_empty(work: Path) -> None:
    (work / "empty").mkdir()


def _failing_copy(name):
    """A copy of study-jobs1 in ``name`` whose routing3-full run cannot rewrite its config.json (a folder
    stands in its place): continuing it fails that run and finishes the others."""
    def prepare(work: Path) -> None:
        shutil.copytree(work / "study-jobs1", work / name)
        config = work / name / "runs" / "routing3-full" / "seed-0" / "config.json"
        config.unlink()
        (config / "in-the-way").mkdir(parents=True)
    return prepare


def _forget_summary(name):
    def prepare(work: Path) -> None:
        (work / name / "summary.md").unlink()
    return prepare


class Masks:
    """What varies from run to run, replaced by ``<...>`` in text."""

    def __init__(self, work: Path):
        self.rules = [
            (re.escape(str(work.resolve())), "<WORK>"),
            (re.escape(str(work)), "<WORK>"),
            (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?", "<TIME>"),
            (r'"seconds": [-+0-9.eE]+', '"seconds": "<SECONDS>"'),
            (r'"pid": \d+', '"pid": "<PID>"'),
            (r"\bpid \d+", "pid <PID>"),
            (r"\| [0-9.]+(ms|s|m|h)\b", "| <SECONDS>"),
            (r"\b\d+(\.\d+)?(ms|s)/(it|step|batch)\b", "<RATE>"),
            (r"\b(\d+h ?)?(\d+m ?)?\d+(\.\d+)?s\b(?! seed)", "<DURATION>"),
            (r"events\.out\.tfevents\.[^\s/\"']+", "events.out.tfevents.<NAME>"),
            (r"\.tmp-[A-Za-z0-9_]+", ".tmp-<NAME>"),
        ]
        host = socket.gethostname()
        if host:
            self.rules.append((r"(?<![\w.-])" + re.escape(host) + r"(?![\w-])", "<HOST>"))

    def text(self, value: str) -> str:
        for pattern, replacement in self.rules:
            value = re.sub(pattern, replacement, value)
        return value


def run_steps(work: Path, out: Path, masks: Masks) -> None:
    env = dict(os.environ, TINYGRAD_CAPS_DEVICE="cpu", TINYGRAD_CAPS_OFFLINE="1", TINYGRAD_CAPS_NUM_THREADS="1",
               MPLBACKEND="Agg", COLUMNS="100", LC_ALL="C.UTF-8", PYTHONHASHSEED="0")
    env.pop("TINYGRAD_CAPS_TEST_CRASH", None)
    for number, (name, argv, how) in enumerate(steps(), 1):
        how = how if isinstance(how, tuple) else (how,)
        for prepare in filter(callable, how):
            prepare(work)
        done = subprocess.run([sys.executable, "-c", ENTRY, *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=1800)
        stdout = done.stdout
        if SORTED in how:
            stdout = "".join(sorted(line for line in stdout.splitlines(keepends=True) if not RUNNING.match(line)))
        folder = out / "steps" / f"{number:02d}-{name}"
        folder.mkdir(parents=True)
        (folder / "argv").write_text(" ".join(argv) + "\n")
        (folder / "exit").write_text(f"{done.returncode}\n")
        (folder / "stdout").write_text(masks.text(stdout))
        (folder / "stderr").write_text(masks.text(done.stderr))
        print(f"{number:02d} {name}: exit {done.returncode}", flush=True)


def npz_digest(path: Path, masks: Masks) -> str:
    """Each member of a checkpoint: its name and SHA-256, and the metadata member's text (masked)."""
    lines = []
    with zipfile.ZipFile(path) as archive:
        for member in archive.infolist():
            raw = archive.read(member)
            if member.filename == "__tinygrad_caps__.npy":
                import numpy as np

                meta = bytes(np.load(io.BytesIO(raw), allow_pickle=False)).decode()
                meta = re.sub(r'\["seconds", \{"value": [-+0-9.eE]+\}\]', '["seconds", {"value": "<SECONDS>"}]', meta)
                lines.append(f"{member.filename}: {masks.text(meta)}")
            else:
                lines.append(f"{member.filename}: {hashlib.sha256(raw).hexdigest()}")
    return "\n".join(lines) + "\n"


def events_digest(path: Path) -> str:
    """A TensorBoard event file's tags of each kind (sorted), and each tag's steps (and scalars' values)."""
    from tensorboard.backend.event_processing import event_accumulator

    read = event_accumulator.EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0,
                                                                        "images": 0, "tensors": 0})
    read.Reload()
    tags = read.Tags()
    lines = []
    for kind in sorted(k for k, v in tags.items() if isinstance(v, list)):
        for tag in sorted(tags[kind]):
            lines.append(f"{kind} {tag}")
    for tag in sorted(tags.get("scalars", [])):
        events = read.Scalars(tag)
        steps = [e.step for e in events]
        values = "" if tag in TIME_TAGS else " values " + " ".join(repr(e.value) for e in events)
        lines.append(f"scalar {tag}: steps {steps}{values}")
    for kind, reader in (("histograms", read.Histograms), ("images", read.Images)):
        for tag in sorted(tags.get(kind, [])):
            lines.append(f"{kind[:-1]} {tag}: steps {[e.step for e in reader(tag)]}")
    return "\n".join(lines) + "\n"


def copy_files(work: Path, out: Path, masks: Masks) -> None:
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        relative = path.relative_to(work)
        if relative.parts[0] == "data":
            continue
        target = out / "files" / masks.text(str(relative))
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".npz":
            Path(f"{target}.txt").write_text(npz_digest(path, masks))
        elif path.name.startswith("events.out.tfevents."):
            Path(f"{target}.txt").write_text(events_digest(path))
        elif path.suffix in (".png", ".pdf", ".svg"):
            target.write_bytes(path.read_bytes())
        else:
            try:
                target.write_text(masks.text(path.read_text()))
            except UnicodeDecodeError:
                target.write_bytes(path.read_bytes())


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python tests/support/behaviour_snapshot.py OUT", file=sys.stderr)
        return 2
    out = Path(args[0])
    if out.exists():
        print(f"behaviour_snapshot: {out} exists; give a new folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="behaviour-snapshot-") as scratch:
        work = Path(scratch)
        tiny_data_dir(work / "data", (24, 12), compress=False)
        masks = Masks(work)
        run_steps(work, out, masks)
        copy_files(work, out, masks)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
