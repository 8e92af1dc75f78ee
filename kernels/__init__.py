"""CUDA kernels (CuPy RawKernels) and their launchers; installed as ``tinygrad_caps.kernels``.

Deals in arrays only and imports nothing of the engine. Each ``.cu`` file here compiles with
NVRTC under CuPy's own options, runs on the CPU through an emulation harness, and on a GPU
against NumPy: that checking code is the sub-package ``checking/``.

    im2col.cu   im2col, col2im (32- and 64-bit index variants)              (launchers in conv.py)
    capsule.cu  capsule_predict, capsule_grad (both adjoints in one pass),
                capsule_grad_u, capsule_grad_w                               (capsule.py)
    routing.cu  routing_weighted_sum (two passes), routing_agreement,
                routing_outer_products (u_hat's gradient through both),
                routing_forward (every routing iteration, forward only)      (routing.py)
    activation.cu  squash_rows, softmax_rows and their adjoints over the last axis  (activation.py)
    optim.cu    adam_step (Adam/AdamW/AMSGrad, in place, one launch per parameter) (optim.py)

    gemm.py     matrix products through cuBLAS, called through ctypes (capturable in a CUDA graph)
    launch.py   the launch record, source loading, the CuPy runner, launch-limit checks
    modules.py  what the GPU runner compiles: each .cu as one RawModule per dtype
    warmup.py   every module of a dtype compiled for a GPU at once, in parallel, at its first launch
                (``warm_up``; ahead of time: ``python -m tinygrad_caps.kernels.warmup``)
    tune.py     the variant of each kernel that has several, measured on the GPU at first use and
                kept on disk (ahead of time: ``python -m tinygrad_caps.kernels.tune``)
    moved.py    old module paths that still import, with a DeprecationWarning (every layer uses it)
    device.py   DeviceError, device names and contexts, array modules (the engine's too)
"""
from . import moved
from .launch import raw_kernels_enabled, use_raw_kernels
from .warmup import warm_up

# the checking modules' paths before kernels/checking/ (CHANGELOG.md): they warn, and go in 0.2
moved.install(__name__, {"emulation": "checking.emulation", "selftest": "checking.selftest",
                         "compile_check": "checking.compile_check"})

__all__ = ["raw_kernels_enabled", "use_raw_kernels", "warm_up"]
