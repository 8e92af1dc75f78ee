"""The process of one run of the local executor:
``python -m tinygrad_caps.models.app.studies.worker DIR CONFIG_ID SEED [--device D] [--deadline-in S] [--first]
[--threads T] [--result-fd FD]``.

It trains the run with ``run_task.train_study_run`` (the same code as the driver's own process and
the Ray tasks), its output going wherever the executor sent it (RUN/train.log), writes its
``RunResult`` as one line of JSON to the file descriptor FD (a pipe the executor reads: the reason
of a failure travels as data), and ends with its outcome's exit status (``outcome.Outcome``:
finished, failed, unreachable, stopped by the study's time limit; 128 + the signal where it was
interrupted: the study's stop file or SIGINT, SIGTERM).

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
    parser.add_argument("--result-fd", type=int, default=None,
                        help="a file descriptor to write the run's result to, as one line of JSON")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with_parent(args.parent)
    deadline = None if args.deadline_in is None else time.monotonic() + args.deadline_in
    from .outcome import Outcome
    from .run_task import train_study_run  # (after the death signal: the imports take a while)

    result = train_study_run(args.out, args.config_id, args.seed, deadline=deadline, device=args.device,
                             threads=args.threads, skip_after_deadline=not args.first, log=_print_flushed)
    if result.outcome in (Outcome.FAILED, Outcome.UNREACHABLE):  # (the run's log says why it ended)
        print(f"failed: {result.reason}", file=sys.stderr, flush=True)
    if args.result_fd is not None:
        try:
            with os.fdopen(args.result_fd, "w", encoding="utf-8") as pipe:
                pipe.write(result.to_json() + "\n")
        except OSError:  # (the driver has gone: no one reads it)
            pass
    return result.exit_code


def _print_flushed(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
