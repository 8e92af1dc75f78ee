"""Launchers for optim.cu: Adam's update of one parameter in one launch, and its capturable form.

Shapes: param, grad and the moments share one shape (any); they are updated in place. The
capturable form reads the learning rate (a float64 array of one element) and the step count (an
int32 array of one element, incremented afterwards with ``increment_counts``) on the device.
"""
from __future__ import annotations

import math

import numpy as np

from .device import absolute_device_of
from .launch import DEFAULT_THREADS, KernelLaunch, check_int32, default_runner, grid_for, i32, prepare, suffix


def adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step: int, lr: float, betas: tuple, eps: float,
              weight_decay: float = 0.0, decoupled: bool = False, runner=None, threads: int = DEFAULT_THREADS) -> None:
    """One Adam step (PyTorch's, bias-corrected) in place on C-contiguous arrays of one dtype.

    ``max_exp_avg_sq``: AMSGrad's running maximum, or None without AMSGrad. ``decoupled``: AdamW's
    ``param *= 1 - lr * weight_decay`` instead of L2 decay added to the gradient. Returns nothing."""
    named = _adam_arrays(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    _check_adam_arrays("adam_step", named, param)
    if param.size == 0:
        return
    beta1, beta2 = betas
    t = param.dtype.type
    scalars = (t(weight_decay), t(1 - lr * weight_decay), t(beta1), t(1 - beta1), t(beta2), t(1 - beta2),
               t(math.sqrt(1 - beta2 ** step)), t(lr / (1 - beta1 ** step)), t(eps))
    maximum = max_exp_avg_sq if max_exp_avg_sq is not None else exp_avg_sq  # not read without AMSGrad
    runner = runner or default_runner([param])
    runner(KernelLaunch("optim.cu", f"adam_step_{suffix(param.dtype)}", grid_for(param.size, threads, runner), (threads,),
                        (param, grad, exp_avg, exp_avg_sq, maximum) + i32(param.size, max_exp_avg_sq is not None, decoupled)
                        + scalars, outputs=()))


def adam_step_capturable(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, betas: tuple, eps: float,
                         weight_decay: float = 0.0, decoupled: bool = False, runner=None,
                         threads: int = DEFAULT_THREADS) -> None:
    """``adam_step`` with ``lr`` (float64, one element) and ``step`` (int32, one element: the steps
    done before this one) read on the device; ``step`` is not changed here (``increment_counts``).
    Returns nothing."""
    named = _adam_arrays(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    _check_adam_arrays("adam_step_capturable", named, param)
    for name, a, dtype in (("lr", lr, np.float64), ("step", step, np.int32)):
        if a.size != 1 or np.dtype(a.dtype) != dtype or absolute_device_of(a) != absolute_device_of(param):
            raise ValueError(f"adam_step_capturable: {name} must be one {np.dtype(dtype)} value on "
                             f"{absolute_device_of(param)}, got {a.dtype} {tuple(a.shape)} on {absolute_device_of(a)}")
    if param.size == 0:
        return
    beta1, beta2 = betas
    t = param.dtype.type
    scalars = (t(weight_decay), t(beta1), t(1 - beta1), t(beta2), t(1 - beta2), t(eps), np.float64(beta1),
               np.float64(beta2), np.float64(weight_decay))
    maximum = max_exp_avg_sq if max_exp_avg_sq is not None else exp_avg_sq
    runner = runner or default_runner([param])
    runner(KernelLaunch("optim.cu", f"adam_step_capturable_{suffix(param.dtype)}", grid_for(param.size, threads, runner),
                        (threads,), (param, grad, exp_avg, exp_avg_sq, maximum)
                        + i32(param.size, max_exp_avg_sq is not None, decoupled) + scalars + (lr, step), outputs=()))


def increment_counts(counts, runner=None, threads: int = DEFAULT_THREADS) -> None:
    """Add one to every element of ``counts`` (int32, C-contiguous) in place. Returns nothing."""
    if np.dtype(counts.dtype) != np.int32 or not counts.flags.c_contiguous:
        raise ValueError(f"increment_counts: takes a C-contiguous int32 array, got {counts.dtype} {tuple(counts.shape)}")
    check_int32("increment_counts", n=counts.size)
    if counts.size == 0:
        return
    runner = runner or default_runner([counts])
    runner(KernelLaunch("optim.cu", "increment_counts_i32", grid_for(counts.size, threads, runner), (threads,),
                        (counts,) + i32(counts.size), outputs=()))


def _adam_arrays(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq) -> dict:
    named = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if max_exp_avg_sq is not None:
        named["max_exp_avg_sq"] = max_exp_avg_sq
    return named


def _check_adam_arrays(op, named, param) -> None:
    """One shape, C-contiguous (updated in place), one float dtype and one device."""
    for name, a in named.items():
        if a.shape != param.shape:
            raise ValueError(f"{op}: {name} of shape {tuple(a.shape)} differs from param of shape {tuple(param.shape)}")
        if not a.flags.c_contiguous:
            raise ValueError(f"{op}: {name} must be C-contiguous (it is updated in place)")
    prepare(op, named, {name: param.ndim for name in named})  # one float dtype, one device
    check_int32(op, n=param.size)
