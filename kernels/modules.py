"""What the GPU runner compiles: each ``kernels/*.cu`` as one CuPy ``RawModule`` per variant, and the
table of the modules this process has loaded.

A ``.cu`` file defines its kernels as templates and instantiates them in one-line ``extern "C"``
wrappers named ``..._f32`` and ``..._f64`` (a few, such as ``increment_counts_i32``, have no dtype).
Compiled whole, a file builds both dtypes, though a run uses one. So each file is compiled per
variant: "f32" (the file without its ``_f64`` wrappers, whose templates are then never
instantiated), "f64" (the converse) and "" (only the wrappers of no dtype, where the file has
some). That halves the work of a float32 run and the longest single compile (routing.cu's). A
wrapper whose body the pattern cannot see whole (braces inside) is kept in every variant: correct,
only slower. The emulation and the compile check build the whole files, as written.
"""
from __future__ import annotations

import re

from .launch import NVRTC_OPTIONS, source_text

VARIANTS = ("f32", "f64", "")
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')
_WRAPPER = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\([^)]*\)\s*'
                      r'\{[^{}]*\}')

_modules = {}  # (source, variant, GPU index) -> compiled RawModule, for this process


def kernel_variant(kernel: str) -> str:
    """The variant that holds ``kernel``: "f32" or "f64" (its name's suffix), or "" for a kernel of no dtype."""
    suffix = kernel.rsplit("_", 1)[-1]
    return suffix if suffix in ("f32", "f64") else ""


def kernel_names(source: str) -> list:
    """The ``extern "C"`` kernels of ``kernels/<source>``, in file order."""
    return _KERNEL.findall(source_text(source))


def module_variants(source: str) -> tuple:
    """The variants ``kernels/<source>`` compiles as: those of VARIANTS that hold one of its kernels."""
    variants = {kernel_variant(name) for name in kernel_names(source)}
    return tuple(v for v in VARIANTS if v in variants)


def module_source(source: str, variant: str) -> str:
    """The text of ``kernels/<source>`` for ``variant``: every kernel wrapper of another variant left out."""
    return _WRAPPER.sub(lambda m: m.group(0) if kernel_variant(m.group(1)) == variant else "", source_text(source))


def module_label(source: str, variant: str) -> str:
    """"routing.cu[f32]": a module's name in reports ("optim.cu[]" for the kernels of no dtype)."""
    return f"{source}[{variant}]"


def module_loaded(source: str, variant: str, device_id: int) -> bool:
    """Whether the ``variant`` module of ``kernels/<source>`` is loaded on GPU ``device_id``."""
    return (source, variant, device_id) in _modules


def raw_module(source: str, variant: str, device_id: int):
    """The RawModule of ``kernels/<source>``'s ``variant`` on GPU ``device_id``, compiled once per process
    and GPU (CuPy's on-disk cache answers for a module an earlier process compiled: see warmup.py).
    Thread-safe for distinct modules, which warmup.py compiles in parallel. RuntimeError with
    NVRTC's log where the compile fails."""
    module = _modules.get((source, variant, device_id))
    if module is not None:
        return module
    import cupy

    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=module_source(source, variant), options=NVRTC_OPTIONS)
        try:
            module.compile()
        except cupy.cuda.compiler.CompileException as exc:
            raise RuntimeError(f"compiling kernels/{source} ({variant or 'no dtype'}) failed:\n"
                               f"{exc.get_message()}") from exc
    return _modules.setdefault((source, variant, device_id), module)
