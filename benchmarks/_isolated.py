"""Running parts of a benchmark in processes of their own, so that a variant that crashes its process
(a CUDA device-side assert poisons the whole CUDA context) costs its own cell of the table, with the
reason, never the table: train_step.py probes each variant's first steps this way, times each
(batch, precision) in a process, and compiles torch.compile's variants apart.

A child reports by printing JSON objects, one per line, on stdout (anything else it prints is
ignored); its stderr is kept to say why it failed.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import NamedTuple

# the lines of a dead child's stderr that say why: CUDA's and PyTorch's errors, asserts, Python's last exception
TELLING = re.compile(r"(assert|error|exception|illegal|out of bounds|out of memory|killed|abort)", re.IGNORECASE)


class ChildResult(NamedTuple):
    """What a child did: its JSON lines, exit status (None: stopped at its time limit), wall seconds,
    and the end of its stderr."""

    lines: list
    exit: int | None
    seconds: float
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.exit == 0


def run_child(command: list, timeout: float, cwd=None, env=None) -> ChildResult:
    """Run ``command`` in a process group of its own; stop the group after ``timeout`` seconds."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=max(timeout, 1))
        status = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        status = None
    lines = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    return ChildResult(lines, status, time.perf_counter() - started, err[-4000:])


def failure_reason(result: ChildResult, what: str = "it") -> str:
    """One line: how a failed child ended and the telling line of its stderr."""
    if result.exit is None:
        how = f"{what} was stopped at its {result.seconds:.0f} s limit"
    elif result.exit < 0:
        try:
            name = signal.Signals(-result.exit).name
        except ValueError:
            name = f"signal {-result.exit}"
        how = f"{what} crashed ({name}) in a process of its own"
    else:
        how = f"{what} failed (exit {result.exit}) in a process of its own"
    telling = [line.strip() for line in result.stderr_tail.splitlines() if TELLING.search(line)]
    return f"{how}: {telling[-1][:300]}" if telling else how


def probe(variant: str, cells: list, command_for, timeout: float, cwd=None) -> dict:
    """Each cell's first steps of ``variant`` in processes of their own: ``command_for(variant, cells)``
    is a command that runs the cells in order, printing {"cell": [precision, batch], "ok": true, ...}
    after each. A cell after which the child died is failed with the reason; the cells after it are
    probed in a new process. Returns {cell: None (it ran) or why not}."""
    results, left = {}, list(cells)
    while left:
        deadline_for = timeout * len(left)
        result = run_child(command_for(variant, left), deadline_for, cwd=cwd)
        done = [tuple(line["cell"]) for line in result.lines if line.get("ok") and "cell" in line]
        for cell in done:
            results[cell] = None
        left = [cell for cell in left if cell not in results]
        if result.ok or not left:
            for cell in left:  # a child that ended well without reporting a cell
                results[cell] = "its probe reported nothing"
            break
        results[left[0]] = failure_reason(result, f"its first steps")
        left = left[1:]
    return results


def emit(**fields) -> None:
    """Print one JSON line for the parent (a child's report)."""
    print(json.dumps(fields, default=float), flush=True)
    sys.stdout.flush()
