"""CUDA kernels (CuPy RawKernels) and their launchers; installed as ``tinygrad_caps.kernels``.

Deals in arrays only and imports nothing of the engine.
"""
