"""A run's checkpoints, ``last.npz`` and ``best.npz``: on resume ``last.npz`` is loaded with its
whole structure validated, the model keeps the checkpoint's options and the run its thread count,
and the run state is restored from it; a checkpoint is saved (never with a non-finite weight), and
each epoch commits ``best.npz`` (when it improved) and ``last.npz``.

A checkpoint holds the model, the optimizer, the scheduler, the engine's RNG state, the epoch, the
number of batches already done in that epoch and the running sums of its metrics, so a resumed run
(after Ctrl-C too) produces the same metrics as one that was never interrupted.
"""
from __future__ import annotations

import json
import sys

import tinygrad_caps as tc

from ...capsnet.config import MODEL_OPTIONS
from ...errors import TrainingDiverged, UsageError
from .checkpoint_schema import validate_optimizer, validate_training_checkpoint
from .config import TrainingConfig, training_config
from .reporting import plural
from .run_options import capsnet_options_newer_than
from .threads import default_threads


class RunCheckpoints:
    """The checkpoints of the run folder ``folder`` (a RunFolder); ``resuming``: ``resume`` was asked
    and ``last.npz`` exists (then ``checkpoint`` holds it, validated, and after ``restore``,
    ``resumed_step`` the global step it was saved at)."""

    def __init__(self, folder, resume: bool):
        self.folder, self.last = folder, folder.last
        self.resuming = resume and self.last.exists()
        self.checkpoint = self._load() if self.resuming else None
        self.resumed_step = 0

    def _load(self) -> dict:
        """``last.npz``, with its whole structure validated (warnings printed to stderr)."""
        checkpoint = tc.load(self.last)
        for warning in validate_training_checkpoint(checkpoint, self.last):
            print(f"tinygrad-caps: warning: {warning}", file=sys.stderr)
        return checkpoint

    def own_config(self, config: TrainingConfig, say) -> TrainingConfig:
        """``config`` as the run trains it: on resume with the checkpoint's model (``keep_model_options``),
        and with its thread count (``thread_count``; ``say`` tells a changed one)."""
        if self.resuming:
            config = keep_model_options(config, self.checkpoint["config"])
        return config.replace(threads=self.thread_count(config, say))

    def thread_count(self, config: TrainingConfig, say) -> int:
        """The threads the run computes with: the config's, else (on resume) the checkpoint's, else
        ``default_threads()``. A resumed run given another count than it trained with is warned that
        its results will differ in their last bits from a run never stopped."""
        saved = (self.checkpoint or {}).get("config", {}).get("threads")
        if config.threads is None:
            return saved or default_threads()
        if saved and saved != config.threads:
            say(f"warning: {self.folder.path} trained with {plural(saved, 'thread')} and continues with "
                f"{config.threads}: BLAS then sums in another order, so its results will differ in their last "
                f"bits from a run never stopped (--threads {saved} keeps them identical)")
        return config.threads

    def restore(self, run, checkpoint: dict) -> None:
        """Load ``checkpoint`` into ``run`` (a Trainer): model, optimizer, scheduler, RNG and progress,
        each checked against the run; says where the run resumes."""
        validate_optimizer(checkpoint["optimizer"], self.last, [p.shape for p in run.optimizer.params])
        progress, config = checkpoint["progress"], run.config
        step, seen = progress["step"], progress["sums"]["seen"]
        if step > len(run.data.loader) or seen > step * config.batch_size or (step > 0) != (seen > 0):
            raise tc.CheckpointError(f"{self.last}: progress (batch {progress['step']}, {progress['sums']['seen']} "
                                     f"images seen) does not fit {len(run.data.train_labels)} training images in "
                                     f"batches of {config.batch_size}; was --batch-size or --limit-train changed?")
        try:
            run.model.load_state_dict(checkpoint["model"])
        except tc.StateDictError as exc:
            raise tc.CheckpointError(f"{self.last}: {exc}") from exc
        run.optimizer.load_state_dict(checkpoint["optimizer"])
        run.scheduler.load_state_dict(checkpoint["scheduler"])
        try:
            tc.random.set_rng_state(checkpoint["rng"])
        except (ValueError, TypeError, KeyError) as exc:
            raise tc.CheckpointError(f"{self.last}: rng holds an unusable generator state ({exc})") from exc
        run.state = progress
        self.resumed_step = run.global_step()  # the gradflow log is cut back to it
        if run.state["epoch"] >= config.epochs:
            run.say(f"{run.out_dir} has trained its {plural(run.state['epoch'], 'epoch')}: nothing to train "
                    f"(--epochs N with N > {run.state['epoch']} extends it)")
        else:
            run.say(f"resuming {run.out_dir} at epoch {run.state['epoch'] + 1}, batch {run.state['step']}")

    def save(self, run, path) -> None:
        """Write a checkpoint of ``run``'s whole state to ``path`` (refused if a weight is non-finite)."""
        run.ensure_run_folder()
        check_finite_weights(run.model, f"not saving {path}", self.last_good())
        tc.save({"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
                 "scheduler": run.scheduler.state_dict(), "rng": tc.random.get_rng_state(), "progress": run.state,
                 "config": run.config.to_dict()}, path)

    def commit(self, run, improved: bool) -> None:
        """An epoch's checkpoints: ``best.npz`` where its test accuracy ``improved``, then ``last.npz``
        (through ``run.save``, which a distributed run's ranks take part in)."""
        if improved:
            run.save(self.folder.best)
        run.save(self.last)

    def last_good(self) -> str:
        """What a failed run leaves: "the last good checkpoint ... is kept", or that none was written."""
        if self.last.exists():
            return f"the last good checkpoint {self.last} is kept"
        return "no checkpoint was written"


def keep_model_options(config: TrainingConfig, saved: dict) -> TrainingConfig:
    """``config`` with the model of a checkpoint's config ``saved``: an option that ``config`` leaves
    unset is taken from it, and one set to another value is refused (UsageError naming both values)."""
    model, network = config.model, dict(config.network)
    saved = {**capsnet_options_newer_than(saved), **saved}  # (the run was built with their defaults)
    for key in ("model",) + MODEL_OPTIONS:
        if key not in saved:
            continue
        current = model if key == "model" else network.get(key)
        if current is not None and _as_json(current) != _as_json(saved[key]):
            raise UsageError(f"--resume: the run's {key} is {saved[key]!r}, not {current!r}; "
                             "a run continues with its own model (start a new run with another --out)")
        if key == "model":
            model = saved[key]
        else:
            network[key] = saved[key]
    return training_config(config, model=model, network=network)


def check_finite_weights(model, what: str, last_good: str) -> None:
    """TrainingDiverged naming the first parameter of ``model`` that holds a NaN or Inf."""
    for name, p in model.named_parameters():
        if not bool(p.xp.isfinite(p.data).all()):
            raise TrainingDiverged(f"{what}: parameter {name} became non-finite (NaN or Inf); {last_good}; "
                                   "try a smaller --lr")


def _as_json(value):
    """``value`` as JSON sees it (tuples are lists), for comparing options with a checkpoint's."""
    return json.loads(json.dumps(value))
