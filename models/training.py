"""Training and evaluation of CapsNet: the loop, metrics, checkpoints and resume.

A checkpoint holds the model, the optimizer, the scheduler, the engine's RNG state, the epoch, the
number of batches already done in that epoch and the running sums of its metrics, so a resumed run
(after Ctrl-C too) produces the same metrics as one that was never interrupted: shuffling and
augmentation are drawn per (seed, epoch, batch), never from a stream that a restart would reset.
"""
from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.datasets import BatchIterator, load_dataset

from .capsnet import CapsNet
from .losses import margin_loss, reconstruction_loss

MODEL_OPTIONS = ("routing_iterations", "routing_gradient", "decoder", "conv1_channels", "primary_types",
                 "primary_dim", "digit_dim", "kernel_size")


def build_model(config: dict) -> CapsNet:
    """A CapsNet with the image geometry (in_channels, image_size, num_classes) and model options in ``config``."""
    kwargs = {k: config[k] for k in MODEL_OPTIONS if k in config}
    return CapsNet(in_channels=config["in_channels"], image_size=config["image_size"],
                   num_classes=config["num_classes"], **kwargs)


def limited(images, labels, limit):
    return (images, labels) if not limit else (images[:limit], labels[:limit])


def batch_losses(model, x, y, reconstruction_weight, train: bool):
    """(mean loss, per-example margin and reconstruction losses, predicted classes) for one batch.

    The decoder is masked by the labels when ``train``, by the prediction otherwise.
    """
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


class Trainer:
    """One training run: the data, the model, the optimizer and schedule, and the run folder."""

    def __init__(self, config: dict, out_dir, resume: bool = False, show_progress: bool = True, log=print):
        if config["batch_size"] < 1:
            raise ValueError(f"batch size must be positive, got {config['batch_size']}")
        self.out_dir, self.show_progress, self.log = Path(out_dir), show_progress, log
        self.last_path = self.out_dir / "checkpoints" / "last.npz"
        device = tc.backend.normalize_device(config.get("device", "auto"))
        self.train_images, self.train_labels = limited(
            *load_dataset(config["dataset"], "train", config.get("data_dir")), config.get("limit_train"))
        self.test_images, self.test_labels = limited(
            *load_dataset(config["dataset"], "test", config.get("data_dir")), config.get("limit_test"))
        _, channels, height, width = self.train_images.shape
        if height != width:
            raise ValueError(f"CapsNet needs square images, got {height}x{width}")
        self.config = dict(config, in_channels=channels, image_size=height,
                           num_classes=int(max(self.train_labels.max(), self.test_labels.max()) + 1))
        self.weight = config.get("reconstruction_weight", 0.0005)

        tc.manual_seed(config["seed"])
        self.model = build_model(self.config).to(device=device, dtype=config.get("dtype", "float32"))
        self.optimizer = tc.optim.Adam(self.model.parameters(), lr=config["lr"])
        self.scheduler = tc.optim.ExponentialLR(self.optimizer, gamma=config["lr_decay"])
        self.loader = BatchIterator(self.train_images, self.train_labels, config["batch_size"], shuffle=True,
                                    augment=config.get("augment"), seed=config["seed"])
        self.state = {"epoch": 0, "step": 0, "sums": _zero_sums(), "best_accuracy": -1.0, "seconds": 0.0}
        resuming = resume and self.last_path.exists()
        if resuming:
            self.restore(tc.load(self.last_path))
        elif resume:
            log(f"nothing to resume in {self.out_dir}; starting afresh")
        self.last_path.parent.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.json").write_text(json.dumps(dict(self.config, version=tc.__version__), indent=2))
        if not resuming:
            (self.out_dir / "metrics.jsonl").write_text("")

    def restore(self, checkpoint):
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        tc.random.set_rng_state(checkpoint["rng"])
        self.state = checkpoint["progress"]
        self.log(f"resuming {self.out_dir} at epoch {self.state['epoch'] + 1}, batch {self.state['step']}")

    def save(self, path):
        tc.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "rng": tc.random.get_rng_state(), "progress": self.state,
                 "config": self.config}, path)

    def run(self) -> list:
        """Train until the configured epoch count; returns the metrics of the epochs run here."""
        history = []
        with _stop_at_batch_boundary() as stop:
            try:
                while self.state["epoch"] < self.config["epochs"]:
                    self.train_epoch(stop)
                    history.append(self.finish_epoch())
            except KeyboardInterrupt:
                self.save(self.last_path)
                self.log(f"\ninterrupted: saved {self.last_path} (epoch {self.state['epoch'] + 1}, batch "
                         f"{self.state['step']}); continue with --resume --out {self.out_dir}")
                raise
        return history

    def train_epoch(self, stop):
        """Train on the rest of the current epoch's batches, adding to the running sums."""
        state, sums = self.state, self.state["sums"]
        self.loader.set_epoch(state["epoch"])
        started = time.perf_counter()
        bar = _progress(len(self.train_images), f"epoch {state['epoch'] + 1}/{self.config['epochs']}", self.show_progress)
        if bar is not None:
            bar.update(min(len(self.train_images), state["step"] * self.config["batch_size"]))
        self.model.train()
        try:
            for x, y in self.loader.batches(state["step"]):
                loss, margin, recon, predicted = batch_losses(self.model, x, y, self.weight, train=True)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                sums["loss"] += loss.item() * len(y)
                sums["margin_loss"] += float(tc.backend.to_numpy(margin.data).sum())
                sums["reconstruction_loss"] += float(tc.backend.to_numpy(recon.data).sum())
                sums["correct"] += int((predicted == y).sum())
                sums["seen"] += len(y)
                state["step"] += 1
                if bar is not None:  # tqdm itself shows images/s
                    bar.update(len(y))
                    bar.set_postfix(loss=f"{sums['loss'] / sums['seen']:.4f}", acc=f"{sums['correct'] / sums['seen']:.3f}")
                if stop["requested"]:
                    raise KeyboardInterrupt
        finally:
            state["seconds"] += time.perf_counter() - started
            if bar is not None:
                bar.close()

    def finish_epoch(self) -> dict:
        """Evaluate, append the epoch's line to metrics.jsonl, step the schedule, write checkpoints."""
        state, sums = self.state, self.state["sums"]
        test = evaluate(self.model, self.test_images, self.test_labels, self.config["batch_size"],
                        self.config["num_classes"], self.weight)
        record = {"epoch": state["epoch"] + 1, "train_loss": sums["loss"] / sums["seen"],
                  "train_margin_loss": sums["margin_loss"] / sums["seen"],
                  "train_reconstruction_loss": sums["reconstruction_loss"] / sums["seen"],
                  "train_accuracy": sums["correct"] / sums["seen"], "test_loss": test["loss"],
                  "test_margin_loss": test["margin_loss"], "test_reconstruction_loss": test["reconstruction_loss"],
                  "test_accuracy": test["accuracy"], "lr": self.optimizer.lr, "seconds": state["seconds"]}
        with open(self.out_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        self.log(f"epoch {record['epoch']}: train loss {record['train_loss']:.4f} acc {record['train_accuracy']:.4f} | "
                 f"test loss {record['test_loss']:.4f} acc {record['test_accuracy']:.4f} | {record['seconds']:.0f}s")
        self.scheduler.step()
        improved = test["accuracy"] > state["best_accuracy"]
        state.update(epoch=state["epoch"] + 1, step=0, sums=_zero_sums(), seconds=0.0,
                     best_accuracy=max(state["best_accuracy"], test["accuracy"]))
        self.save(self.last_path)
        if improved:
            self.save(self.last_path.parent / "best.npz")
        return record


def train(config: dict, out_dir, resume: bool = False, show_progress: bool = True, log=print) -> list:
    """Train a CapsNet as ``config`` says (the CLI's options); returns the per-epoch metrics.

    Writes ``config.json``, appends one line per epoch to ``metrics.jsonl``, and keeps
    ``checkpoints/last.npz`` (also on Ctrl-C, at the next batch boundary) and ``checkpoints/best.npz``.
    """
    return Trainer(config, out_dir, resume, show_progress, log).run()


@contextlib.contextmanager
def _stop_at_batch_boundary():
    """Turn the first Ctrl-C into a request to stop after the current batch (a second one interrupts
    at once). Yields a dict whose "requested" entry the training loop polls."""
    flag = {"requested": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def request_stop(signum, frame):
        if flag["requested"]:
            raise KeyboardInterrupt
        flag["requested"] = True

    previous = signal.signal(signal.SIGINT, request_stop)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _zero_sums():
    return {"loss": 0.0, "margin_loss": 0.0, "reconstruction_loss": 0.0, "correct": 0, "seen": 0}


def load_checkpoint_model(path, overrides=None, device="auto"):
    """Rebuild the model a checkpoint was trained with (options in ``overrides`` win) and load it."""
    checkpoint = tc.load(path)
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "config" not in checkpoint:
        raise tc.CheckpointError(f"{path} is not a tinygrad-caps training checkpoint (no model or config)")
    config = dict(checkpoint["config"], **(overrides or {}))
    missing = [k for k in ("in_channels", "image_size", "num_classes") if k not in config]
    if missing:
        raise tc.CheckpointError(f"{path}: its config lacks {', '.join(missing)}; it was written by an older version")
    model = build_model(config)
    model.to(dtype=checkpoint["model"]["conv1.weight"].dtype)
    model.load_state_dict(checkpoint["model"])
    model.to(device=tc.backend.normalize_device(device))
    return model, config


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
