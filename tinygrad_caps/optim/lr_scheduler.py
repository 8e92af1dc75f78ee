"""Learning-rate schedulers that set ``optimizer.lr``: ExponentialLR, StepLR, ReduceLROnPlateau."""
from __future__ import annotations

import math


class LRScheduler:
    """Base: ``step()`` once per epoch sets ``optimizer.lr`` from the epoch count."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.base_lr = optimizer.lr
        self.last_epoch = 0

    def lr_at(self, epoch: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        self.optimizer.lr = self.lr_at(self.last_epoch)

    def get_last_lr(self) -> float:
        return self.optimizer.lr

    def state_dict(self) -> dict:
        """Every attribute but the optimizer, as plain values."""
        return {k: v for k, v in vars(self).items() if k != "optimizer"}

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch."""

    def __init__(self, optimizer, gamma: float):
        super().__init__(optimizer)
        self.gamma = gamma

    def lr_at(self, epoch):
        return self.base_lr * self.gamma ** epoch


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1):
        super().__init__(optimizer)
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = step_size, gamma

    def lr_at(self, epoch):
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class ReduceLROnPlateau:
    """Multiply lr by ``factor`` when a metric has not improved for ``patience`` epochs (PyTorch's rules).

    ``step(metric)`` once per epoch; ``mode`` is "min" or "max"; ``threshold_mode`` "rel" or "abs".
    """

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0.0, eps=1e-8):
        if factor >= 1.0:
            raise ValueError("ReduceLROnPlateau: factor must be < 1")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: unknown mode {mode!r} or threshold_mode {threshold_mode!r}")
        self.optimizer = optimizer
        self.mode, self.factor, self.patience = mode, factor, patience
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.cooldown, self.min_lr, self.eps = cooldown, min_lr, eps
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self.last_epoch = 0

    def _is_better(self, value):
        if self.mode == "min":
            bound = self.best * (1 - self.threshold) if self.threshold_mode == "rel" else self.best - self.threshold
            return value < bound
        bound = self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold
        return value > bound

    def step(self, metric) -> None:
        value = float(metric)
        self.last_epoch += 1
        if self._is_better(value):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            new_lr = max(self.optimizer.lr * self.factor, self.min_lr)
            if self.optimizer.lr - new_lr > self.eps:
                self.optimizer.lr = new_lr
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0

    def get_last_lr(self) -> float:
        return self.optimizer.lr

    state_dict = LRScheduler.state_dict
    load_state_dict = LRScheduler.load_state_dict
