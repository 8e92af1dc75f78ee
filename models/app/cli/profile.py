"""``tinygrad-caps train --profile N``: where a training step spends its time, per op.

Builds the run exactly as ``train`` does (a :class:`~..training.Trainer`, which writes nothing
before its first batch), runs N training batches (forward, backward, Adam step) under
:func:`tinygrad_caps.profile`, prints the per-op table and exits. No run folder is created.
"""
from __future__ import annotations

import time

import tinygrad_caps as tc

from ...errors import UsageError
from ..training.trainer import Trainer, batch_losses, training_config


def profile_training(config, batches: int, cuda_sync: bool = True, log=print):
    """Profile ``batches`` training steps of the run ``config`` describes (the train command's
    TrainingConfig, or its dict form).

    Returns ``(profile, seconds)``: the :class:`tinygrad_caps.profiler.Profile` and the wall time of
    the profiled steps. On CUDA the ops are synchronized so the times are those of the work.
    """
    if batches < 1:
        raise UsageError(f"--profile needs a positive number of batches, got {batches}")
    trainer = Trainer(training_config(config, log_gradflow=None), out_dir=".", show_progress=False, log=log)
    trainer.model.train()
    done, started = 0, time.perf_counter()
    with tc.profile(cuda_sync=cuda_sync) as prof:
        while done < batches:
            for x, y in trainer.data.loader.batches(0):
                loss, _, _, _ = batch_losses(trainer.model, x, y, trainer.config.reconstruction_weight, train=True)
                trainer.optimizer.zero_grad()
                loss.backward()
                trainer.optimizer.step()
                done += 1
                if done == batches:
                    break
    return prof, time.perf_counter() - started


def run(config, batches: int, log=print) -> int:
    """Profile, print the table and a one-line summary; returns the exit status 0."""
    config = training_config(config)
    prof, seconds = profile_training(config, batches, log=log)
    log(prof.table(sort_by="total", top=25))
    log(f"{batches} training batches of {config.batch_size} in {seconds:.2f} s "
        f"({seconds / batches:.3f} s per batch, profiling overhead included)")
    return 0
