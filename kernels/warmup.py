"""Compile every kernel module for a GPU at once, in parallel, and keep the result on disk.

Each ``kernels/*.cu`` compiles as one CuPy ``RawModule`` per dtype (``modules.py``), by NVRTC, the
first time a process asks for it on a device: one after another, at their first launches, that is
seconds of a first epoch. :func:`warm_up` compiles all the modules of the dtypes asked for, for one
GPU, in a thread pool (NVRTC releases the GIL while it compiles, and compiles in several threads
at once), so the wait is about the slowest module's. The engine calls it at the first kernel
launch of each dtype on each GPU (``launch._raw_kernel``): a run in float32 compiles the float32
modules only, and a CPU-only run never launches a kernel, so it never imports CuPy or compiles
anything here. ``TINYGRAD_CAPS_KERNEL_WARM_UP=0`` turns the first-launch warm-up off (each module
then compiles at its own first launch).

Across processes, CuPy keeps every compiled module on disk: ``RawModule(code=...)`` compiles
through ``cupy._core.core.compile_with_cache``, which looks in ``CUPY_CACHE_DIR`` (default
``~/.cupy/kernel_cache``, read when CuPy is imported) for a cubin named by the SHA-1 of the
source, the NVRTC options (ours, CuPy's include folders, ``-ftz=true``, ``-arch=sm_XX``), the
NVRTC version and CuPy's header checksum, and writes one there after compiling. So a second
process on the same machine (same GPU architecture, CuPy, NVRTC and sources) compiles nothing,
and an edited ``.cu`` simply gets new entries.

Ahead of time (after installing, or in a container image built on a GPU machine)::

    python -m tinygrad_caps.kernels.warmup [--device 0 1 | --all] [--dtype float32 float64]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import launch, modules
from .device import DeviceError, cupy_module, parse_cuda_index

ENV_SWITCH = "TINYGRAD_CAPS_KERNEL_WARM_UP"  # "0": no warm-up at the first launch

_warm: set = set()  # (GPU index, variant) whose modules are all loaded in this process
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """What one :func:`warm_up` call did on one GPU.

    device: the GPU index. modules: the modules ("routing.cu[f32]", ``modules.module_label``)
    compiled or loaded from CuPy's disk cache by this call (empty when the process had them all
    already). seconds: the call's wall time. module_seconds: {module: seconds its own compile or
    load took}; their sum over ``seconds`` is the parallelism reached. workers: threads used.
    """

    device: int
    modules: tuple
    seconds: float
    module_seconds: dict
    workers: int


def first_launch_warm_up_enabled() -> bool:
    """Whether the first kernel launch on a GPU warms up every module (``TINYGRAD_CAPS_KERNEL_WARM_UP``)."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def cupy_cache_dir() -> Path:
    """The folder CuPy keeps compiled kernels in: ``$CUPY_CACHE_DIR``, else ``~/.cupy/kernel_cache``."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or "~/.cupy/kernel_cache").expanduser()


def default_workers(modules: int) -> int:
    """Threads for ``modules`` compiles: one each, at most the CPUs this process may run on."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(modules, cpus))


def device_index(device) -> int:
    """The GPU index of ``device``: None (CuPy's current GPU), an int, "cuda" or "cuda:N".
    Raises DeviceError where CuPy is missing or finds no such GPU: kernels compile for a GPU."""
    cupy = cupy_module()
    if cupy is None:
        raise DeviceError("compiling the kernels needs CuPy and a GPU; CuPy is not installed "
                          "(pip install 'tinygrad-caps[cuda]')")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001  (a machine without a driver: said, not hidden)
        raise DeviceError(f"compiling the kernels needs a GPU; CuPy finds none: {exc}") from None
    if count == 0:
        raise DeviceError("compiling the kernels needs a GPU; CuPy finds none")
    if isinstance(device, str):
        if not device.startswith("cuda"):
            raise DeviceError(f"kernels compile for a GPU, not for {device!r}")
        device = parse_cuda_index(device, device)
    index = cupy.cuda.Device().id if device is None else int(device)
    if not 0 <= index < count:
        raise DeviceError(f"no GPU {index}: CuPy finds {count}")
    return index


def _load(source: str, variant: str, device: int) -> float:
    """Compile (or load from CuPy's disk cache) one module for GPU ``device``, in a pool thread;
    returns the seconds it took."""
    cupy = cupy_module()
    # A new thread starts on GPU 0; cudaSetDevice also makes the GPU's primary context current
    # (CUDA 12 and later) for loading the compiled module there.
    cupy.cuda.runtime.setDevice(device)
    started = time.perf_counter()
    modules.raw_module(source, variant, device)
    return time.perf_counter() - started


def variants_for(dtypes) -> tuple:
    """The module variants that ``dtypes`` (float32, float64) need: theirs and "" (the kernels of no dtype)."""
    return tuple(launch.suffix(np.dtype(d)) for d in dtypes) + ("",)


def warm_up(device=None, dtypes=(np.float32, np.float64), workers: int | None = None) -> WarmUp:
    """Compile every kernel module of ``dtypes`` (each ``kernels/*.cu`` per dtype) for one GPU, in
    parallel, or load it from CuPy's on-disk cache; a later call in the same process does nothing.

    Args:
        device: None (CuPy's current GPU), an index, "cuda" or "cuda:N".
        dtypes: the dtypes whose kernels to compile (float32, float64); the kernels of no dtype always.
        workers: threads (default: one per module, at most the CPUs available).
    Returns:
        a :class:`WarmUp`. Raises DeviceError without a GPU, TypeError for a dtype without kernels,
        RuntimeError naming the module whose compile failed (with NVRTC's log).
    """
    index = device_index(device)
    for dtype in dtypes:
        if not launch.has_kernels_for(dtype):
            raise TypeError(f"warm_up: the kernels come in float32 and float64, not {np.dtype(dtype)}")
    with _lock:  # one warm-up at a time; a second caller finds the work done
        started = time.perf_counter()
        variants = [v for v in variants_for(dtypes) if (index, v) not in _warm]
        pending = [(source, v) for source in launch.cuda_sources() for v in modules.module_variants(source)
                   if v in variants and not modules.module_loaded(source, v, index)]
        threads = workers or default_workers(len(pending))
        module_seconds = {}
        if pending:
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kernel-warm-up") as pool:
                seconds = pool.map(lambda unit: _load(*unit, index), pending)
                module_seconds = {modules.module_label(*unit): s for unit, s in zip(pending, seconds)}
        _warm.update((index, v) for v in variants)
        return WarmUp(index, tuple(module_seconds), time.perf_counter() - started, module_seconds,
                      threads if pending else 0)


def warm_up_at_first_launch(device: int, variant: str) -> None:
    """Called by the GPU runner before a launch asks for a kernel it has not used yet: warms up the
    modules of the kernel's dtype (``variant``: "f32", "f64" or "") on ``device`` once, unless
    ``TINYGRAD_CAPS_KERNEL_WARM_UP=0``."""
    if (device, variant) not in _warm and first_launch_warm_up_enabled():
        warm_up(device, dtypes=[dtype for dtype, suffix in launch.DTYPE_SUFFIX.items() if suffix == variant])


def main(argv=None) -> int:
    """Build CuPy's kernel cache for the GPUs named (default: the current one); returns 0, or 2
    without a GPU."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--device", nargs="+", default=None, help="GPU indices or cuda:N (default: the current GPU)")
    where.add_argument("--all", action="store_true", help="every GPU of this machine")
    parser.add_argument("--dtype", nargs="+", choices=["float32", "float64"], default=["float32", "float64"])
    args = parser.parse_args(argv)
    try:
        if args.all:
            device_index(None)  # DeviceError without a GPU
            devices = range(cupy_module().cuda.runtime.getDeviceCount())
        elif args.device:
            devices = [device_index(d if d.startswith("cuda") else int(d)) for d in args.device]
        else:
            devices = [device_index(None)]
    except (DeviceError, ValueError) as exc:
        print(f"warm-up: {exc}", file=sys.stderr)
        return 2
    cache = cupy_cache_dir()
    for device in devices:
        before = set(os.listdir(cache)) if cache.is_dir() else set()
        done = warm_up(device, dtypes=args.dtype)
        new = len(set(os.listdir(cache)) - before) if cache.is_dir() else 0
        print(f"cuda:{device}: {len(done.modules)} kernel modules ready in {done.seconds:.2f} s "
              f"({done.workers} threads; {new} new files in CuPy's kernel cache {cache})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
