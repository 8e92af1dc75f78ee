"""``train --log-gradflow N``: every N training batches, the routing statistics and per-iteration,
per-path gradient norms of that batch, read from the step that runs anyway (its forward records
the routing traces, its backward retains their gradients), one JSON line each in RUN/gradflow.jsonl.
With ``--log-mode-cosine`` the line also holds the cosine between that step's gradient and the
other routing-gradient mode's on the same batch and weights (one more forward and backward).
"""
from __future__ import annotations

import json
from pathlib import Path

from ...analysis.routing_statistics import layer_statistics, network_scores
from .run_state import keep_covered_lines


class GradflowLog:
    """Decides which steps to log and appends their lines to ``path``.

    Args:
        path: the JSON-lines file (RUN/gradflow.jsonl).
        every: log every ``every``-th training step (steps counted from 1 over the whole run).
        fresh: start the file afresh at the first line written (a new run); else append (a resumed one).
    """

    def __init__(self, path, every: int, fresh: bool = True):
        if every < 1:
            raise ValueError(f"--log-gradflow must be a positive integer, got {every}")
        self.path, self.every, self.fresh = Path(path), int(every), fresh

    def due(self, step: int) -> bool:
        """True when global step ``step`` (1-based) is to be logged."""
        return step % self.every == 0

    def write(self, epoch: int, batch: int, step: int, mode: str, traces, mode_cosine=None) -> dict:
        """Append one line for the traces of a step whose backward has run (gradients retained); returns it.

        Layout: {"epoch", "batch" (1-based within the epoch), "step" (1-based over the run), "mode" (the
        routing gradient mode), "layers": [{"name", "d_score_from" ("activations" or "lengths": what
        the layer's D-score is taken from), "iterations": [{"iteration", statistics...}]}],
        "network": the network's T and D (``routing_statistics.network_scores``)}, and with
        ``mode_cosine`` (``train --log-mode-cosine``) "mode_cosine": {parameter or "all": the cosine
        between the step's gradient and the other routing-gradient mode's}.
        """
        layers = [layer_statistics(trace) for trace in traces]
        record = {"epoch": epoch, "batch": batch, "step": step, "mode": mode, "layers": layers,
                  "network": network_scores(layers)}
        if mode_cosine is not None:
            record["mode_cosine"] = mode_cosine
        with open(self.path, "w" if self.fresh else "a") as f:
            f.write(json.dumps(record) + "\n")
        self.fresh = False
        return record


def keep_gradflow_through_step(path, step: int) -> int:
    """Keep the lines of a gradflow log that a checkpoint at global step ``step`` covers; returns how
    many were dropped: the rule of ``run_state.keep_covered_lines`` (a line is covered when its step
    is at most ``step``; one that is not a complete record, cut short by a kill when last)."""
    if not Path(path).exists():
        return 0

    def covers(number, line):
        logged = _logged_step(line)
        return None if logged is None else logged <= step

    return keep_covered_lines(path, covers)


def _logged_step(line: str):
    """The global step of one gradflow line, or None if the line is not a complete record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
