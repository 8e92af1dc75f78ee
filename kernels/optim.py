"""Launcher for optim.cu: Adam's update of one parameter in one launch.

Shapes: param, grad and the moments share one shape (any); they are updated in place.
"""
from __future__ import annotations

import math

from .launch import DEFAULT_THREADS, KernelLaunch, check_int32, default_runner, grid_for, i32, prepare, suffix


def adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step: int, lr: float, betas: tuple, eps: float,
              weight_decay: float = 0.0, decoupled: bool = False, runner=None, threads: int = DEFAULT_THREADS) -> None:
    """One Adam step (PyTorch's, bias-corrected) in place on C-contiguous arrays of one dtype.

    ``max_exp_avg_sq``: AMSGrad's running maximum, or None without AMSGrad. ``decoupled``: AdamW's
    ``param *= 1 - lr * weight_decay`` instead of L2 decay added to the gradient. Returns nothing."""
    named = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if max_exp_avg_sq is not None:
        named["max_exp_avg_sq"] = max_exp_avg_sq
    for name, a in named.items():
        if a.shape != param.shape:
            raise ValueError(f"adam_step: {name} of shape {tuple(a.shape)} differs from param of shape {tuple(param.shape)}")
        if not a.flags.c_contiguous:
            raise ValueError(f"adam_step: {name} must be C-contiguous (it is updated in place)")
    prepare("adam_step", named, {name: param.ndim for name in named})  # one float dtype, one device
    check_int32("adam_step", n=param.size)
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
