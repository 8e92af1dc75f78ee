"""The wall time of one study scheduled three ways, in one session on one machine: one run at a time
with every core (``--jobs 1``), two runs at a time with one thread each (``--jobs 2 --threads-per-run
1``) and on a local Ray with the same placement (``--executor ray --cpus-per-run 1
--threads-per-run 1``), as ratios to the first. It also checks that the two schedulings with one
thread per run wrote the same metrics (wall-clock fields aside) and the same summary.json.

    python benchmarks/studies/parallel_study_timing.py --data-dir /usr/share/datasets/fashion-mnist \\
        --out runs/parallel-timing [--limit-train 5000 --limit-test 1000 --epochs 1 --seeds 2]

Prints a Markdown table (and writes it with the figures as JSON to OUT/timing.json); the study
folders stay in OUT for inspection (not to be committed).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

SCHEDULINGS = {
    "jobs1": ["--jobs", "1"],
    "jobs2": ["--jobs", "2", "--threads-per-run", "1"],
    "ray": ["--executor", "ray", "--cpus-per-run", "1", "--threads-per-run", "1"],
}


def study_command(out: Path, args, scheduling) -> list:
    """The ``study run gradient-modes`` command line of one scheduling."""
    return [sys.executable, "-m", "tinygrad_caps.models.cli", "study", "run", "gradient-modes", "--out", str(out),
            "--dataset", "fashion-mnist", "--data-dir", args.data_dir, "--limit-train", str(args.limit_train),
            "--limit-test", str(args.limit_test), "--epochs", str(args.epochs), "--seeds", str(args.seeds),
            "--conv1-channels", "64", "--primary-types", "16", "--device", "cpu", "--no-progress", *scheduling]


def run_files(out: Path) -> dict:
    """{run path: metrics lines without "seconds"} and summary.json's text of the study in ``out``."""
    plan = json.loads((out / "study.json").read_text())
    runs = {}
    for config in plan["configs"]:
        for run in config["runs"]:
            lines = [json.loads(line) for line in (out / run["path"] / "metrics.jsonl").read_text().splitlines()]
            runs[run["path"]] = [{k: v for k, v in line.items() if k != "seconds"} for line in lines]
    return {"runs": runs, "summary": (out / "summary.json").read_text()}


def main(argv=None) -> int:
    """Time the study under every scheduling (resuming what an earlier call finished); print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit-train", type=int, default=5000)
    parser.add_argument("--limit-test", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "timing.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"seconds": {}}
    for name, scheduling in SCHEDULINGS.items():
        if name in record["seconds"]:
            continue
        folder = out / name
        if folder.exists():
            raise SystemExit(f"{folder} exists from an interrupted timing: delete it and run again")
        started = time.perf_counter()
        subprocess.run(study_command(folder, args, scheduling), check=True, stdout=subprocess.DEVNULL)
        record["seconds"][name] = time.perf_counter() - started
        record_path.write_text(json.dumps(record, indent=2) + "\n")
    same = run_files(out / "jobs2") == run_files(out / "ray")
    seconds = record["seconds"]
    record.update(identical_jobs2_ray=same, machine=f"{platform.processor() or platform.machine()}, "
                  f"{len(os.sched_getaffinity(0))} usable CPUs", budget=vars(args))
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    print("| scheduling | wall time | ratio to --jobs 1 |")
    print("| --- | --- | --- |")
    for name, scheduling in SCHEDULINGS.items():
        print(f"| `{' '.join(scheduling)}` | {seconds[name]:.0f} s | {seconds[name] / seconds['jobs1']:.2f}x |")
    print(f"\nRay over --jobs 2 at the same placement: {seconds['ray'] / seconds['jobs2'] - 1:+.1%}; "
          f"metrics and summary.json identical between them: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
