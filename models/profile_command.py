"""``tinygrad-caps train --profile N``: where a training step spends its time, per op.

Builds the model, the data and the optimizer exactly as ``train`` would, runs N training batches
(forward, backward, Adam step) under :func:`tinygrad_caps.profile`, prints the per-op table and
exits. No run folder is created and nothing is written.
"""
from __future__ import annotations

import time

import tinygrad_caps as tc
from tinygrad_caps.data import BatchIterator, dataset_spec

from .training import batch_losses, build_model, limited


def profile_training(config: dict, batches: int, cuda_sync: bool = True):
    """Profile ``batches`` training steps of the run ``config`` describes (the train command's options).

    Returns ``(profile, seconds)``: the :class:`tinygrad_caps.profiler.Profile` and the wall time of
    the profiled steps. On CUDA the ops are synchronized so the times are those of the work.
    """
    if batches < 1:
        raise ValueError(f"--profile needs a positive number of batches, got {batches}")
    device = tc.backend.normalize_device(config.get("device", "auto"))
    spec = dataset_spec(config["dataset"], config.get("data_dir"), config.get("image_size"), config.get("channels"))
    images, labels = limited(*spec.load("train", config.get("data_dir")), config.get("limit_train"))
    full = dict(config, in_channels=spec.channels, image_size=spec.image_size, num_classes=spec.num_classes)
    tc.manual_seed(config["seed"])
    model = build_model(full).to(device=device, dtype=config.get("dtype", "float32"))
    optimizer = tc.optim.Adam(model.parameters(), lr=config["lr"])
    augment = spec.augment if config.get("augment") == "default" else config.get("augment")
    loader = BatchIterator(images, labels, config["batch_size"], shuffle=True, augment=augment, seed=config["seed"],
                           preprocess=spec.train_preprocess)
    weight = config.get("reconstruction_weight", 0.0005)
    model.train()
    done, started = 0, time.perf_counter()
    with tc.profile(cuda_sync=cuda_sync) as prof:
        while done < batches:
            for x, y in loader.batches(0):
                loss, _, _, _ = batch_losses(model, x, y, weight, train=True)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                done += 1
                if done == batches:
                    break
    return prof, time.perf_counter() - started


def run(config: dict, batches: int, log=print) -> int:
    """Profile, print the table and a one-line summary; returns the exit status 0."""
    prof, seconds = profile_training(config, batches)
    log(prof.table(sort_by="total", top=25))
    log(f"{batches} training batches of {config['batch_size']} in {seconds:.2f} s "
        f"({seconds / batches:.3f} s per batch, profiling overhead included)")
    return 0
