"""CUDA kernels (CuPy RawKernels) and their launchers; installed as ``tinygrad_caps.kernels``.

Deals in arrays only and imports nothing of the engine. Each ``.cu`` file here compiles with
NVRTC (``compile_check``) and runs on the CPU through the emulation harness (``emulation``).

    im2col.cu   im2col, col2im                          (launchers in conv.py)
    capsule.cu  capsule_predict, capsule_grad_u/_w      (capsule.py)
    routing.cu  routing_weighted_sum, routing_agreement (routing.py)
"""
from .launch import raw_kernels_enabled, use_raw_kernels

__all__ = ["raw_kernels_enabled", "use_raw_kernels"]
