"""Progress bars (tqdm, on stderr) for the commands that run longer than a few seconds: shown only
on a terminal and without ``--no-progress``, so logs and pipes get no bar; a training run's epoch
bar is a part of the run (``ProgressBar``)."""
from __future__ import annotations

import contextlib
import sys

from .callbacks import TrainingPart


def stderr_is_terminal() -> bool:
    """True when stderr is an interactive terminal (where a bar redraws in place)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def bars_wanted(no_progress: bool) -> bool:
    """Whether a command shows bars: not with ``--no-progress``, and only on a terminal."""
    return not no_progress and stderr_is_terminal()


def progress_bar(total, description, enabled, unit="img"):
    """A tqdm bar of ``total`` ``unit``s (cleared when done), disabled unless ``enabled``; None
    without tqdm. Callers ``update`` it and ``close`` it."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, unit=unit, disable=not enabled, dynamic_ncols=True, leave=False)


@contextlib.contextmanager
def progress_shown(total, description, enabled, unit="img"):
    """``with progress_shown(...) as bar``: a ``progress_bar`` (or None), closed when the block ends."""
    bar = progress_bar(total, description, enabled, unit=unit)
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()


class ProgressBar(TrainingPart):
    """The epoch's tqdm bar (``enabled``: on a terminal, without --no-progress): the images trained,
    the loss and accuracy whenever the sums are read; lines written above it (``say``)."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar = enabled, None

    def on_epoch_start(self, run) -> None:
        state, images = run.state, len(run.data.train_images)
        self.bar = progress_bar(images, f"epoch {state['epoch'] + 1}/{run.config.epochs}", self.enabled)
        if self.bar is not None:
            self.bar.update(min(images, state["step"] * run.config.batch_size))

    def on_step(self, run, step) -> None:
        if self.bar is None:
            return
        self.bar.update(step.images * run.shard[1])  # tqdm itself shows images/s; every rank trained on as many
        if step.flushed:
            sums = run.state["sums"]
            self.bar.set_postfix(loss=f"{sums['loss'] / sums['seen']:.4f}", acc=f"{sums['correct'] / sums['seen']:.3f}")

    def on_epoch_trained(self, run) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar = None

    def say(self, text: str, log=print) -> None:
        """``log(text)``; above the bar while one is drawn and ``log`` is print (not onto its line)."""
        if self.bar is not None and not self.bar.disable and log is print:
            self.bar.write(text)  # clears the bar, prints, redraws it below
        else:
            log(text)
