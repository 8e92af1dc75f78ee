"""The executor of a ``study run`` call, chosen by its Placement: None (train in the driver's own
process, ``runner.train_runs``), a ``LocalExecutor`` (worker processes) or a ``RayExecutor`` (Ray
tasks). Every executor trains a run with ``run_task.train_study_run``."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def executor_for(placement, out):
    """``with executor_for(placement, out) as executor``: the executor of ``placement`` for the study
    folder ``out`` (None: the driver's own process), released when the block ends (its processes
    killed where still running, a local Ray stopped). A Ray cluster that cannot be reached is a
    UsageError here, before the study's folder is created."""
    if placement.in_process:
        yield None
        return
    if placement.executor == "ray":
        from .ray_executor import RayExecutor

        executor = RayExecutor(out, placement)
    else:
        from .local_executor import LocalExecutor

        executor = LocalExecutor(out, placement)
    try:
        yield executor
    finally:
        executor.close()
