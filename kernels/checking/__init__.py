"""What checks the kernels, apart from the kernels themselves; installed as
``tinygrad_caps.kernels.checking``.

    emulation.py      the same .cu sources on the CPU, compiled with g++ behind cuda_shim.h
                      (``Emulator``, a runner for any launcher; ``selfcheck``; sanitizers)
    cuda_shim.h       CUDA's names for g++: fibers or OS threads per CUDA thread, warps, checks
    reference.py      NumPy versions of each kernel: the oracles of every check
    selftest.py       every kernel on a GPU against NumPy
                      (``python -m tinygrad_caps.kernels.checking.selftest [--small]``)
    compile_check.py  every .cu through NVRTC with CuPy's options, and nvcc, no GPU needed

The old paths ``tinygrad_caps.kernels.emulation``, ``.selftest`` and ``.compile_check`` still
import these modules, with a DeprecationWarning (``kernels/moved.py``; CHANGELOG.md).
"""
