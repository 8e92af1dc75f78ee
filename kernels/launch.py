"""What every launcher shares: the launch record, CUDA source loading, the CuPy runner, checks.

A launcher (``conv.py``, ``capsule.py``, ``routing.py``) validates its arrays, allocates the
output, and builds one :class:`KernelLaunch` (kernel name, grid, block, arguments). A *runner*
executes it: :func:`run_on_gpu` through a CuPy ``RawModule`` (compiled once per process and
device, then cached), or ``emulation.Emulator`` on the CPU with the very same record.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

import numpy as np

SOURCE_DIR = Path(__file__).resolve().parent
# Options given to RawModule; the compile check adds the architecture and
# --device-as-default-execution-space, which CuPy adds itself.
NVRTC_OPTIONS = ("--std=c++17",)
DTYPE_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
DEFAULT_THREADS = 256
MAX_BLOCKS = 65535

_raw_enabled = os.environ.get("TINYGRAD_CAPS_RAW_KERNELS", "1") != "0"


def use_raw_kernels(enabled: bool) -> None:
    """Turn our RawKernels on or off for CuPy arrays (off: plain CuPy matmul/einsum, for comparison)."""
    global _raw_enabled
    _raw_enabled = bool(enabled)


def raw_kernels_enabled() -> bool:
    """Whether CuPy arrays go through our RawKernels (``TINYGRAD_CAPS_RAW_KERNELS=0`` turns them off)."""
    return _raw_enabled


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: ``source`` file, ``kernel`` name, grid and block, and the arguments
    (arrays and NumPy scalars, in the kernel's parameter order). ``outputs`` indexes the arrays
    the kernel writes."""

    source: str
    kernel: str
    grid: tuple
    block: tuple
    args: tuple
    outputs: tuple


def source_text(name: str) -> str:
    """The text of ``kernels/<name>``."""
    return (SOURCE_DIR / name).read_text()


def cuda_sources() -> list[str]:
    """Names of every .cu file that ships with the package."""
    return sorted(p.name for p in SOURCE_DIR.glob("*.cu"))


def grid_for(total: int, threads: int = DEFAULT_THREADS) -> tuple:
    """A 1-D grid for a grid-stride loop over ``total`` elements."""
    return (max(1, min(MAX_BLOCKS, -(-total // threads))),)


def suffix(dtype) -> str:
    """"f32" or "f64": the kernel-name suffix for ``dtype``."""
    return DTYPE_SUFFIX[np.dtype(dtype)]


def array_module_of(array):
    """``numpy`` or ``cupy`` for an array (CuPy is imported only when given a CuPy array)."""
    if type(array).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def prepare(op: str, named_arrays: dict, ndims: dict):
    """Check that arrays share one float dtype and one device and have the right ranks; return
    them C-contiguous (RawKernels ignore strides), in the given order."""
    first_name, first = next(iter(named_arrays.items()))
    xp = array_module_of(first)
    dtype = np.dtype(first.dtype)
    if dtype not in DTYPE_SUFFIX:
        raise TypeError(f"{op}: kernels take float32 or float64, got {first_name} of dtype {dtype}")
    out = []
    for name, a in named_arrays.items():
        if array_module_of(a) is not xp:
            raise ValueError(f"{op}: {name} and {first_name} are on different devices")
        if np.dtype(a.dtype) != dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype}, {first_name} has {dtype}")
        if a.ndim != ndims[name]:
            raise ValueError(f"{op}: {name} must have {ndims[name]} dimensions, got shape {tuple(a.shape)}")
        if xp is not np and a.device.id != first.device.id:
            raise ValueError(f"{op}: {name} is on GPU {a.device.id}, {first_name} on GPU {first.device.id}")
        out.append(xp.ascontiguousarray(a))
    return xp, out


def check_int32(op: str, **sizes) -> None:
    """Sizes are passed as int32: refuse any that would overflow."""
    for name, value in sizes.items():
        if not 0 <= value < 2 ** 31:
            raise ValueError(f"{op}: {name}={value} does not fit the kernel's int32 argument")


def i32(*values):
    """Python ints as np.int32 scalars, matching the kernels' ``int`` parameters."""
    return tuple(np.int32(v) for v in values)


@functools.lru_cache(maxsize=None)
def _raw_module(source: str, device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=source_text(source), options=NVRTC_OPTIONS)
        try:
            module.compile()
        except cupy.cuda.compiler.CompileException as exc:
            raise RuntimeError(f"compiling kernels/{source} failed:\n{exc.get_message()}") from exc
    return module


def run_on_gpu(launch: KernelLaunch) -> None:
    """Execute a launch on the current CUDA device through a cached CuPy RawModule."""
    import cupy

    module = _raw_module(launch.source, cupy.cuda.Device().id)
    module.get_function(launch.kernel)(launch.grid, launch.block, launch.args)


def default_runner(arrays):
    """The runner for these arrays: the GPU for CuPy arrays; NumPy arrays need an explicit runner."""
    if array_module_of(arrays[0]) is np:
        raise TypeError("these RawKernels take CuPy arrays; to run them on NumPy arrays pass "
                        "runner=tinygrad_caps.kernels.emulation.Emulator()")
    return run_on_gpu


def empty_like_output(xp, shape, dtype):
    """An uninitialized output; the emulator fills outputs with NaN before launching."""
    return xp.empty(shape, dtype=dtype)
