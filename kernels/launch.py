"""What every launcher shares: the launch record, CUDA source loading, the CuPy runner, checks.

A launcher (``conv.py``, ``capsule.py``, ``routing.py``) validates its arrays (one dtype, one
device: :class:`DeviceError` otherwise), allocates the outputs on that device, and builds
:class:`KernelLaunch` records (kernel name, grid, block, arguments, dynamic shared memory). A
*runner* executes them: :func:`run_on_gpu` on the GPU that holds the arrays, through a CuPy
``RawModule`` compiled once per process, device and dtype (``modules.py``; the kernel objects are
cached too), or
``checking.emulation.Emulator`` on the CPU with the very same record. Both check CUDA's launch limits.
The first launch of a dtype on a GPU compiles every module of that dtype at once, in parallel (``warmup.py``).
The engine asks :func:`kernel_runner_for` which runner serves an array.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from pathlib import Path

import numpy as np

from .device import DeviceError, absolute_device_of, array_module, on_device_of

SOURCE_DIR = Path(__file__).resolve().parent
# Our options for RawModule; CuPy adds its own (include paths, -ftz=true, the architecture and
# --device-as-default-execution-space), which compile_check reads from CuPy itself.
NVRTC_OPTIONS = ("--std=c++17",)
DTYPE_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
DEFAULT_THREADS = 256
MAX_BLOCKS = 65535
# CUDA's launch limits (compute capability 8.0 and 9.0).
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2 ** 31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 48 * 1024  # without cudaFuncAttributeMaxDynamicSharedMemorySize, which we never set
VECTOR_BYTES = 16  # float4 / double2

_raw_enabled = os.environ.get("TINYGRAD_CAPS_RAW_KERNELS", "1") != "0"


_numpy_runner = None


@contextlib.contextmanager
def run_numpy_arrays_with(runner):
    """Within this context the engine sends NumPy arrays through the kernels too, run by ``runner``
    (a ``checking.emulation.Emulator``): how the engine's ops are tested on the kernel path without a GPU."""
    global _numpy_runner
    previous, _numpy_runner = _numpy_runner, runner
    try:
        yield runner
    finally:
        _numpy_runner = previous


def kernel_runner_for(array):
    """The runner the engine should use for ``array``: the GPU runner for a CuPy array (unless
    ``use_raw_kernels(False)``), the emulator inside ``run_numpy_arrays_with``, else None (the
    engine's own NumPy or CuPy code)."""
    if array_module(array) is not np:
        return run_on_gpu if _raw_enabled else None
    return _numpy_runner


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
    shared_mem: int = 0  # bytes of dynamic shared memory


class LaunchError(ValueError):
    """A launch configuration that CUDA would refuse (cudaErrorInvalidConfiguration and kin)."""


def check_launch_limits(launch: KernelLaunch) -> None:
    """Raise LaunchError where CUDA would refuse the launch: a zero or oversized grid or block
    dimension, more than 1024 threads per block, or more than 48 KiB of dynamic shared memory."""
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    block = tuple(launch.block) + (1,) * (3 - len(launch.block))
    if len(grid) != 3 or len(block) != 3:
        raise LaunchError(f"{launch.kernel}: grid {launch.grid} and block {launch.block} take at most 3 dimensions")
    for name, dims, limits in (("grid", grid, MAX_GRID_DIM), ("block", block, MAX_BLOCK_DIM)):
        for axis, (dim, limit) in enumerate(zip(dims, limits)):
            if not 1 <= int(dim) <= limit:
                raise LaunchError(f"{launch.kernel}: {name} dimension {'xyz'[axis]} is {dim}; CUDA allows 1 to {limit}")
    if block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
        raise LaunchError(f"{launch.kernel}: block {block} has {block[0] * block[1] * block[2]} threads; "
                          f"CUDA allows at most {MAX_THREADS_PER_BLOCK}")
    if not 0 <= launch.shared_mem <= MAX_SHARED_BYTES:
        raise LaunchError(f"{launch.kernel}: {launch.shared_mem} bytes of dynamic shared memory; "
                          f"at most {MAX_SHARED_BYTES} without the opt-in")


def fits_shared_memory(values: int, dtype) -> bool:
    """Whether ``values`` of ``dtype`` fit one block's shared memory (48 KiB, no opt-in). The engine
    asks before launching a kernel that stages a whole capsule layer slice there, and takes
    another path when they do not fit."""
    return values * np.dtype(dtype).itemsize <= MAX_SHARED_BYTES


def source_text(name: str) -> str:
    """The text of ``kernels/<name>``."""
    return (SOURCE_DIR / name).read_text()


def cuda_sources() -> list[str]:
    """Names of every .cu file that ships with the package."""
    return sorted(p.name for p in SOURCE_DIR.glob("*.cu"))


def block_limit(runner) -> int:
    """The most blocks a grid-stride launcher may use with ``runner`` (the emulator may cap it)."""
    return getattr(runner, "max_blocks", None) or MAX_BLOCKS


def grid_for(total: int, threads: int = DEFAULT_THREADS, runner=None) -> tuple:
    """A 1-D grid for a grid-stride loop over ``total`` work items, ``threads`` per block."""
    return (max(1, min(block_limit(runner), -(-total // threads))),)


def has_kernels_for(dtype) -> bool:
    """Whether the kernels come in ``dtype`` (float32 and float64 do)."""
    return np.dtype(dtype) in DTYPE_SUFFIX


def suffix(dtype) -> str:
    """"f32" or "f64": the kernel-name suffix for ``dtype``."""
    return DTYPE_SUFFIX[np.dtype(dtype)]


def prepare(op: str, named_arrays: dict, ndims: dict):
    """Check that arrays share one float dtype and one device and have the right ranks; return
    them C-contiguous (RawKernels ignore strides), in the given order, on their own device.
    Raises DeviceError when they live on different devices."""
    first_name, first = next(iter(named_arrays.items()))
    xp = array_module(first)
    dtype = np.dtype(first.dtype)
    if not has_kernels_for(dtype):
        raise TypeError(f"{op}: kernels take float32 or float64, got {first_name} of dtype {dtype}")
    for name, a in named_arrays.items():
        if absolute_device_of(a) != absolute_device_of(first):
            raise DeviceError(f"{op}: {name} is on {absolute_device_of(a)} but {first_name} is on "
                              f"{absolute_device_of(first)}; move them to one device first")
        if np.dtype(a.dtype) != dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype}, {first_name} has {dtype}")
        if a.ndim != ndims[name]:
            raise ValueError(f"{op}: {name} must have {ndims[name]} dimensions, got shape {tuple(a.shape)}")
    with on_device_of(first):
        return xp, [xp.ascontiguousarray(a) for a in named_arrays.values()]


def aligned(array) -> bool:
    """Whether ``array``'s data starts on a 16-byte boundary (vector loads and stores need it)."""
    pointer = array.data.ptr if hasattr(array.data, "ptr") else array.ctypes.data
    return pointer % VECTOR_BYTES == 0


def vector_width(dtype) -> int:
    """Values of ``dtype`` in one vector load or store (float4: 4, double2: 2)."""
    return VECTOR_BYTES // np.dtype(dtype).itemsize


def check_int32(op: str, **sizes) -> None:
    """Sizes are passed as int32: refuse any that would overflow."""
    for name, value in sizes.items():
        if not 0 <= value < 2 ** 31:
            raise ValueError(f"{op}: {name}={value} does not fit the kernel's int32 argument")


def i32(*values):
    """Python ints as np.int32 scalars, matching the kernels' ``int`` parameters."""
    return tuple(np.int32(v) for v in values)


@functools.lru_cache(maxsize=None)
def _raw_kernel(source: str, kernel: str, device_id: int):
    from .modules import kernel_variant, raw_module
    from .warmup import warm_up_at_first_launch

    variant = kernel_variant(kernel)
    warm_up_at_first_launch(device_id, variant)  # every module of this dtype at once, in parallel (once)
    return raw_module(source, variant, device_id).get_function(kernel)


def launch_device_id(launch: KernelLaunch) -> int:
    """The GPU that holds a launch's arrays (DeviceError when they are spread over several)."""
    ids = {a.device.id for a in launch.args if type(a).__module__.startswith("cupy")}
    if len(ids) != 1:
        raise DeviceError(f"{launch.kernel}: its arrays are on GPUs {sorted(ids)}; a launch needs them on one")
    return ids.pop()


def run_on_gpu(launch: KernelLaunch) -> None:
    """Execute a launch on the GPU that holds its arrays, through a cached CuPy RawModule."""
    import cupy

    check_launch_limits(launch)
    device_id = launch_device_id(launch)
    with cupy.cuda.Device(device_id):
        _raw_kernel(launch.source, launch.kernel, device_id)(launch.grid, launch.block, launch.args,
                                                             shared_mem=launch.shared_mem)


def default_runner(arrays):
    """The runner for these arrays: the GPU for CuPy arrays; NumPy arrays need an explicit runner."""
    if array_module(arrays[0]) is np:
        raise TypeError("these RawKernels take CuPy arrays; to run them on NumPy arrays pass "
                        "runner=tinygrad_caps.kernels.checking.emulation.Emulator()")
    return run_on_gpu


def empty_like_output(xp, shape, dtype, like=None):
    """An uninitialized output on the device of ``like``; the emulator fills outputs with NaN first."""
    with on_device_of(like) if like is not None else contextlib.nullcontext():
        return xp.empty(shape, dtype=dtype)
