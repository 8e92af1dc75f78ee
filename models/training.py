"""Training and evaluation of CapsNet: the loop, metrics, checkpoints and resume.

A checkpoint holds the model, the optimizer, the scheduler, the engine's RNG state, the epoch, the
number of batches already done in that epoch and the running sums of its metrics, so a resumed run
(after Ctrl-C too) produces the same metrics as one that was never interrupted: shuffling and
augmentation are drawn per (seed, epoch, batch), never from a stream that a restart would reset.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.datasets import BatchIterator, load_dataset

from .capsnet import CapsNet
from .losses import margin_loss, reconstruction_loss

MODEL_OPTIONS = ("routing_iterations", "routing_gradient", "decoder", "conv1_channels", "primary_types",
                 "primary_dim", "digit_dim", "kernel_size")


def build_model(config: dict, images_shape) -> CapsNet:
    """A CapsNet for images of ``images_shape`` (N, C, H, W) with the model options in ``config``."""
    _, channels, height, width = images_shape
    if height != width:
        raise ValueError(f"CapsNet needs square images, got {height}x{width}")
    kwargs = {k: config[k] for k in MODEL_OPTIONS if k in config}
    return CapsNet(in_channels=channels, image_size=height, num_classes=config.get("num_classes", 10), **kwargs)


def limited(images, labels, limit):
    return (images, labels) if not limit else (images[:limit], labels[:limit])


def batch_losses(model, x, y, reconstruction_weight, train: bool):
    """(loss, margin, reconstruction, correct) for one batch; masks by label when training."""
    v, lengths, reconstruction = model(tc.tensor(x, device=model.device), y if train else None)
    margin = margin_loss(lengths, y)
    recon = reconstruction_loss(reconstruction, tc.tensor(x, device=model.device))
    loss = tc.functional.mean(margin + reconstruction_weight * recon)
    predicted = tc.backend.to_numpy(lengths.data.argmax(axis=1))
    return loss, margin, recon, predicted


def evaluate(model, images, labels, batch_size, num_classes, reconstruction_weight=0.0005, progress=None):
    """Accuracy, mean losses and the confusion matrix (rows: true class) on a dataset, no augmentation."""
    model.eval()
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    total_loss = total_margin = total_recon = 0.0
    with tc.no_grad():
        for x, y in BatchIterator(images, labels, batch_size):
            loss, margin, recon, predicted = batch_losses(model, x, y, reconstruction_weight, train=False)
            np.add.at(confusion, (y, predicted), 1)
            total_loss += loss.item() * len(y)
            total_margin += float(tc.backend.to_numpy(margin.data).sum())
            total_recon += float(tc.backend.to_numpy(recon.data).sum())
            if progress is not None:
                progress.update(len(y))
    n = max(1, int(confusion.sum()))
    return {"accuracy": float(np.trace(confusion) / n), "loss": total_loss / n, "margin_loss": total_margin / n,
            "reconstruction_loss": total_recon / n, "confusion": confusion}


def _progress(total, description, enabled):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, unit="img", disable=not enabled, dynamic_ncols=True, leave=False)


def train(config: dict, out_dir: Path, resume: bool = False, show_progress: bool = True, log=print) -> list:
    """Train a CapsNet as ``config`` says (the CLI's options); returns the per-epoch metrics.

    Writes ``config.json``, appends one line per epoch to ``metrics.jsonl``, and keeps
    ``checkpoints/last.npz`` (also on Ctrl-C) and ``checkpoints/best.npz``.
    """
    out_dir = Path(out_dir)
    checkpoints = out_dir / "checkpoints"
    last_path = checkpoints / "last.npz"
    device = tc.backend.normalize_device(config.get("device", "auto"))
    if config["batch_size"] < 1:
        raise ValueError(f"batch size must be positive, got {config['batch_size']}")

    train_images, train_labels = limited(*load_dataset(config["dataset"], "train", config.get("data_dir")),
                                         config.get("limit_train"))
    test_images, test_labels = limited(*load_dataset(config["dataset"], "test", config.get("data_dir")),
                                       config.get("limit_test"))
    config = dict(config, num_classes=int(max(train_labels.max(), test_labels.max()) + 1))

    tc.manual_seed(config["seed"])
    model = build_model(config, train_images.shape).to(device=device, dtype=config.get("dtype", "float32"))
    model.device = device
    optimizer = tc.optim.Adam(model.parameters(), lr=config["lr"])
    scheduler = tc.optim.ExponentialLR(optimizer, gamma=config["lr_decay"])
    loader = BatchIterator(train_images, train_labels, config["batch_size"], shuffle=True, augment=config.get("augment"),
                           seed=config["seed"])

    state = {"epoch": 0, "step": 0, "sums": _zero_sums(), "best_accuracy": -1.0, "seconds": 0.0}
    if resume and last_path.exists():
        checkpoint = tc.load(last_path)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        tc.random.set_rng_state(checkpoint["rng"])
        state = checkpoint["progress"]
        log(f"resuming {out_dir} at epoch {state['epoch'] + 1}, batch {state['step']}")
    elif resume:
        log(f"nothing to resume in {out_dir}; starting afresh")
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoints.mkdir(exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(dict(config, version=tc.__version__), indent=2, default=str))
    if not (resume and last_path.exists()):
        (out_dir / "metrics.jsonl").write_text("")

    def save(path):
        tc.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "rng": tc.random.get_rng_state(), "progress": state, "config": config}, path)

    history = []
    weight = config.get("reconstruction_weight", 0.0005)
    try:
        while state["epoch"] < config["epochs"]:
            loader.set_epoch(state["epoch"])
            started = time.perf_counter()
            bar = _progress(len(train_images), f"epoch {state['epoch'] + 1}/{config['epochs']}", show_progress)
            if bar is not None:
                bar.update(min(len(train_images), state["step"] * config["batch_size"]))
            model.train()
            for x, y in loader.batches(state["step"]):
                loss, margin, recon, predicted = batch_losses(model, x, y, weight, train=True)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                sums = state["sums"]
                sums["loss"] += loss.item() * len(y)
                sums["margin_loss"] += float(tc.backend.to_numpy(margin.data).sum())
                sums["reconstruction_loss"] += float(tc.backend.to_numpy(recon.data).sum())
                sums["correct"] += int((predicted == y).sum())
                sums["seen"] += len(y)
                state["step"] += 1
                if bar is not None:
                    bar.update(len(y))
                    elapsed = time.perf_counter() - started
                    bar.set_postfix(loss=f"{sums['loss'] / sums['seen']:.4f}", acc=f"{sums['correct'] / sums['seen']:.3f}",
                                    img_s=f"{bar.n / max(elapsed, 1e-9):.0f}")
            if bar is not None:
                bar.close()
            state["seconds"] += time.perf_counter() - started
            test = evaluate(model, test_images, test_labels, config["batch_size"], config["num_classes"], weight)
            sums = state["sums"]
            record = {"epoch": state["epoch"] + 1, "train_loss": sums["loss"] / sums["seen"],
                      "train_margin_loss": sums["margin_loss"] / sums["seen"],
                      "train_reconstruction_loss": sums["reconstruction_loss"] / sums["seen"],
                      "train_accuracy": sums["correct"] / sums["seen"], "test_loss": test["loss"],
                      "test_margin_loss": test["margin_loss"], "test_reconstruction_loss": test["reconstruction_loss"],
                      "test_accuracy": test["accuracy"], "lr": optimizer.lr, "seconds": state["seconds"]}
            with open(out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            history.append(record)
            log(f"epoch {record['epoch']}: train loss {record['train_loss']:.4f} acc {record['train_accuracy']:.4f} | "
                f"test loss {record['test_loss']:.4f} acc {record['test_accuracy']:.4f} | {record['seconds']:.0f}s")
            scheduler.step()
            improved = test["accuracy"] > state["best_accuracy"]
            state.update(epoch=state["epoch"] + 1, step=0, sums=_zero_sums(), seconds=0.0,
                         best_accuracy=max(state["best_accuracy"], test["accuracy"]))
            save(last_path)
            if improved:
                save(checkpoints / "best.npz")
    except KeyboardInterrupt:
        save(last_path)
        log(f"\ninterrupted: saved {last_path} (epoch {state['epoch'] + 1}, batch {state['step']}); "
            f"continue with --resume --out {out_dir}")
        raise
    return history


def _zero_sums():
    return {"loss": 0.0, "margin_loss": 0.0, "reconstruction_loss": 0.0, "correct": 0, "seen": 0}


def load_checkpoint_model(path, overrides=None, device="auto"):
    """Rebuild the model a checkpoint was trained with (options in ``overrides`` win) and load it."""
    checkpoint = tc.load(path)
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "config" not in checkpoint:
        raise tc.CheckpointError(f"{path} is not a tinygrad-caps training checkpoint (no model or config)")
    config = dict(checkpoint["config"], **(overrides or {}))
    channels, size = checkpoint["model"]["conv1.weight"].shape[1], config.get("image_size")
    shape = (1, channels, size, size) if size else None
    model = build_model(config, shape or _image_shape(config))
    model.to(dtype=checkpoint["model"]["conv1.weight"].dtype)
    model.load_state_dict(checkpoint["model"])
    device = tc.backend.normalize_device(device)
    model.to(device=device)
    model.device = device
    return model, config


def _image_shape(config):
    images, _ = load_dataset(config["dataset"], "test", config.get("data_dir"))
    return images.shape


def save_reconstructions(path, images, reconstructions, count=16):
    """A PNG with ``count`` inputs (top row) above their reconstructions (bottom row)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--reconstructions needs matplotlib: pip install 'tinygrad-caps[viz]'") from exc
    count = min(count, len(images))
    channels, size = images.shape[1], images.shape[2]
    fig, axes = plt.subplots(2, count, figsize=(count, 2.2))
    for k in range(count):
        for row, picture in enumerate((images[k], reconstructions[k].reshape(channels, size, size))):
            ax = axes[row, k] if count > 1 else axes[row]
            ax.imshow(np.moveaxis(picture, 0, -1).squeeze(), cmap="gray", vmin=0, vmax=1)
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
