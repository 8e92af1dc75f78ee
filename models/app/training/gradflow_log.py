"""``train --log-gradflow N``: every N training batches, the routing statistics and per-iteration,
per-path gradient norms of that batch, read from the step that runs anyway (its forward records
the routing traces, its backward retains their gradients), one JSON line each in RUN/gradflow.jsonl.
With ``--log-mode-cosine`` the line also holds the cosine between that step's gradient and the
other routing-gradient mode's on the same batch and weights (one more forward and backward).
``GradflowSink`` is the part of a run that does this (and cuts the file back to the checkpoint on
resume); ``GradflowLog`` writes the lines.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...analysis.gradflow import mode_gradient_cosines
from ...analysis.routing_statistics import layer_statistics, network_scores
from ...capsnet.model import CapsNet
from .callbacks import TrainingPart
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


class GradflowSink(TrainingPart):
    """--log-gradflow: which steps trace, their lines, the mode cosine.

    ``every``: log every ``every``-th step (None: log none, but still cut RUN/gradflow.jsonl back to
    the checkpoint on resume, as the metrics are); ``path``: the log; ``fresh``: a new run's log
    starts afresh at its first line. Only a CapsNet's steps trace (the baseline CNN has no routing),
    and of several ranks only rank 0's, the statistics of its own part of the batch.
    """

    def __init__(self, path, every: int | None = None, fresh: bool = True):
        self.path = Path(path)
        self.log = GradflowLog(path, every, fresh=fresh) if every else None
        self.mode_cosine = None  # the last traced step's cosines between the routing-gradient modes

    def on_folder_ready(self, run) -> None:
        if not run.checkpoints.resuming:
            return
        step = run.checkpoints.resumed_step
        dropped = keep_gradflow_through_step(self.path, step)
        if dropped:
            run.say(f"dropped {dropped} line{'s' * (dropped > 1)} of {run.out_dir / 'gradflow.jsonl'} beyond the "
                    f"checkpoint's step {step} (or cut short)")

    def wants_traces(self, run, step: int) -> bool:
        return (self.log is not None and isinstance(run.model, CapsNet) and run.shard[0] == 0
                and self.log.due(step))

    def after_backward(self, run, images, labels, traces) -> None:
        """With --log-mode-cosine, a traced step's cosine between its gradient and the other mode's
        (before the optimizer moves the weights)."""
        if traces is not None and run.config.log_mode_cosine and isinstance(run.model, CapsNet):
            self.mode_cosine = mode_gradient_cosines(run.model, images, labels, run.config.reconstruction_weight)

    def on_step(self, run, step) -> None:
        """A traced step's line, then every part's ``on_gradflow`` with it."""
        if not step.traces:
            return
        state = run.state
        record = self.log.write(state["epoch"] + 1, state["step"], run.global_step(), run.model.digit.gradient,
                                step.traces, self.mode_cosine if run.config.log_mode_cosine else None)
        run.parts.on_gradflow(run, record, step.traces)
