"""What the tests of parallel and Ray studies share (tests/app/test_study_parallel.py, test_study_ray.py):
the tiny study they run, its command line, and the files compared between schedulings."""
import json

from cli_helpers import TINY, tiny_data_dir
from helpers import metrics_without_times

# gradient-modes: 3 configurations x 1 seed, 2 epochs each: two runs at a time (--jobs 2) and one waiting,
# the least that tests scheduling (each run is a process: a second seed doubled these tests' time)
STUDY = ["--seeds", "1", "--epochs", "2"]


def study_data(root):
    """The dataset options of these studies: "tiny" in ``root``, 24 training and 12 test images."""
    return ["--dataset", "tiny", "--data-dir", str(tiny_data_dir(root, (24, 12), compress=False))]


def study_argv(out, data, *extra, name="gradient-modes"):
    """The arguments of ``study run NAME`` into ``out`` with the tiny models and STUDY's budget, then ``extra``."""
    return ["study", "run", name, "--out", str(out), *data, *TINY, *STUDY, *extra]


def study_files(out):
    """({run path: its metrics.jsonl lines without "seconds"}, summary.json's text) of the study in ``out``:
    what must not depend on how the runs were scheduled."""
    plan = json.loads((out / "study.json").read_text())
    runs = {run["path"]: metrics_without_times(out / run["path"]) for config in plan["configs"]
            for run in config["runs"]}
    return runs, (out / "summary.json").read_text()


def leftovers(out):
    """Lock and stop files left in the study folder ``out`` (none once a study has ended)."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name in ("run.lock", "study.stop", "study.lock"))
