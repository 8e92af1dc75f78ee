"""Optimizers and learning-rate schedulers."""
from .lr_scheduler import ExponentialLR, LRScheduler, ReduceLROnPlateau, StepLR
from .optimizer import SGD, Adam, AdamW, Optimizer

__all__ = ["Adam", "AdamW", "ExponentialLR", "LRScheduler", "Optimizer", "ReduceLROnPlateau", "SGD", "StepLR"]
