"""RUN/metrics.jsonl as a part of a run: emptied when a run starts, cut back to the checkpoint's
epochs when it resumes (``run_state.keep_metrics_through_epoch``), and one line per epoch appended
and fsynced before the epoch's checkpoint is written (the checkpoint is the single source of truth)."""
from __future__ import annotations

import json

from .callbacks import TrainingPart
from .run_state import append_metrics_line, keep_metrics_through_epoch, write_text_atomically


class MetricsFile(TrainingPart):
    """RUN/metrics.jsonl: emptied or cut on resume; one fsynced line per epoch."""

    def on_folder_ready(self, run) -> None:
        metrics = run.folder.metrics
        if not run.checkpoints.resuming:
            write_text_atomically(metrics, "")
            return
        epochs = run.state["epoch"]
        dropped = keep_metrics_through_epoch(metrics, epochs)
        if dropped:
            run.say(f"dropped {dropped} line{'s' * (dropped > 1)} of {metrics} beyond the checkpoint's epoch {epochs}")

    def on_epoch_end(self, run, record: dict) -> None:
        append_metrics_line(run.folder.metrics, json.dumps(record))
