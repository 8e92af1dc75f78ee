"""The process of one run of the local executor:
``python -m tinygrad_caps.models.app.studies.worker DIR CONFIG_ID SEED [--device D] [--deadline-in S] [--first]
[--threads T]``.

It trains the run with ``run_task.train_study_run`` (the same code as the driver's own process and
the Ray tasks), its output going wherever the executor sent it (RUN/train.log), and ends with:

    0   finished               75  stopped by the study's time limit
    1   failed (RUN/failed.json holds the error line)
    130 interrupted (the study's stop file, SIGINT), 143 (SIGTERM)

On Linux it asks the kernel to kill it when the driver dies (PR_SET_PDEATHSIG), so a killed driver
leaves no run training behind; ``--resume`` continues those runs from their last checkpoint.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time

FAILED_PREFIX = "failed: "  # the worker's last line where its run failed
EXIT_FOR = {"finished": 0, "failed": 1, "unreachable": 2, "stopped": 75}
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have this process killed (SIGKILL) when its parent ends; exit at once if it has ended already."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the driver ended before the request took effect
        os._exit(137)


def main(argv=None) -> int:
    """Train one run of a study (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="tinygrad_caps.models.app.studies.worker")
    parser.add_argument("out")
    parser.add_argument("config_id")
    parser.add_argument("seed", type=int)
    parser.add_argument("--device", default=None)
    parser.add_argument("--deadline-in", type=float, default=None, help="seconds until the study's time limit")
    parser.add_argument("--first", action="store_true", help="train at least one batch, even after the time limit")
    parser.add_argument("--parent", type=int, default=None, help="the driver's pid")
    parser.add_argument("--threads", type=int, default=None,
                        help="the run's threads (--threads-per-run given), even where it started with others")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with_parent(args.parent)
    deadline = None if args.deadline_in is None else time.monotonic() + args.deadline_in
    from .run_task import train_study_run  # (after the death signal: the imports take a while)

    outcome = train_study_run(args.out, args.config_id, args.seed, deadline=deadline, device=args.device,
                              threads=args.threads, skip_after_deadline=not args.first, log=_print_flushed)
    if outcome["status"] in ("failed", "unreachable"):
        print(f"{FAILED_PREFIX}{outcome['error']}", file=sys.stderr, flush=True)
    if outcome["status"] == "interrupted":
        return 128 + outcome.get("signum", int(signal.SIGINT))
    return EXIT_FOR[outcome["status"]]


def _print_flushed(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
