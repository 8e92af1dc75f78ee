"""A training run: its options (``config.TrainingConfig``), the loop (``trainer``) and its parts (the
checks before data, ``preflight``; the data, ``run_data``; the step, ``step_runner``; checkpoints,
``checkpointing``; stop conditions, ``stopping``; the sinks called at fixed points, ``callbacks``:
metrics file, progress bar, TensorBoard and gradflow logs), its folder (``run_folder.RunFolder``),
checkpoints (``checkpoints``, ``checkpoint_schema``), crash-consistent logs (``run_state``,
``run_logs``), device sums, distributed training (``distributed``), presets, resource checks, the
command line's options and the resume rules (``run_options``), output paths and option checks, and
how a user error is told from a bug (``reporting``)."""
from .config import TrainingConfig
from .run_folder import RunFolder

_LOOP = {"Trainer", "train", "evaluate"}  # from .trainer, imported on first use (it loads the data code)


def __getattr__(name):
    if name in _LOOP:
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RunFolder", "Trainer", "TrainingConfig", "evaluate", "train"]
