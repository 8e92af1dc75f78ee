"""Run our CUDA kernels on the CPU: the same .cu source, compiled with g++ behind ``cuda_shim.h``.

Each kernel gets a small generated C wrapper that takes the grid, the block and CUDA's
``void** args`` array, so a :class:`~tinygrad_caps.kernels.launch.KernelLaunch` built by the
ordinary launcher runs here unchanged: ``capsule_predict(u, W, runner=Emulator())``.

Every CUDA thread is an OS thread (blocks run one at a time): use tiny shapes. Outputs are
filled with NaN before each launch, so an element the kernel never writes fails the comparison.

Sanitizers: ``Emulator(sanitize="thread")`` builds with ThreadSanitizer (a missing
``__syncthreads`` or a racy ``+=`` is reported even when results match) and
``sanitize="address"`` with AddressSanitizer (out-of-bounds reads). Their runtime must be loaded
before Python starts, so run them as ``python -m tinygrad_caps.kernels.emulation --sanitize thread``,
which re-executes itself with the runtime preloaded and checks every kernel on small shapes.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .launch import SOURCE_DIR, KernelLaunch

SANITIZER_FLAGS = {None: [], "thread": ["-fsanitize=thread"], "address": ["-fsanitize=address", "-fno-omit-frame-pointer"]}
SANITIZER_RUNTIME = {"thread": "libtsan.so", "address": "libasan.so"}
_KERNEL_SIGNATURE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')


def kernel_signatures(source: str) -> dict:
    """{kernel name: [parameter C types]} for every ``extern "C" __global__`` function in a .cu text."""
    found = {}
    for name, params in _KERNEL_SIGNATURE.findall(source):
        types = []
        for param in params.split(","):
            param = " ".join(param.replace("__restrict__", "").split())
            types.append(param.rsplit(" ", 1)[0].strip())
        found[name] = types
    return found


def wrapper_source(sources, source_dir: Path = SOURCE_DIR) -> str:
    """C++ that includes each .cu and defines ``emu_<kernel>(gx, gy, gz, bx, by, bz, void** args)``."""
    lines = []
    for name in sources:
        lines.append(f'#include "{source_dir / name}"')
    for name in sources:
        for kernel, types in kernel_signatures((source_dir / name).read_text()).items():
            call = ", ".join(f"*({t}*)args[{i}]" for i, t in enumerate(types))
            lines.append(
                f'extern "C" void emu_{kernel}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
                f"unsigned bz, void** args) {{ emu::launch(dim3(gx, gy, gz), dim3(bx, by, bz), [args] {{ {kernel}({call}); }}); }}"
            )
    return "\n".join(lines) + "\n"


def sanitizer_runtime(kind: str) -> str:
    """Path of g++'s runtime library for a sanitizer ("thread" or "address")."""
    path = subprocess.run(["g++", f"-print-file-name={SANITIZER_RUNTIME[kind]}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not os.path.isabs(path):
        raise RuntimeError(f"g++ has no {SANITIZER_RUNTIME[kind]}; install its sanitizer runtime")
    return path


class Emulator:
    """A runner that executes KernelLaunch records on the CPU (see the module docstring)."""

    def __init__(self, sanitize: str | None = None, build_dir: str | None = None, source_dir: str | None = None):
        if sanitize not in SANITIZER_FLAGS:
            raise ValueError(f"Emulator: sanitize must be None, 'thread' or 'address', got {sanitize!r}")
        self.sanitize = sanitize
        self.source_dir = Path(source_dir) if source_dir else SOURCE_DIR
        self.build_dir = Path(build_dir or os.environ.get("TINYGRAD_CAPS_EMULATION_DIR")
                              or Path(tempfile.gettempdir()) / "tinygrad-caps-emulation")
        self._library = None
        self.launches = 0

    def library(self):
        """Build (once, cached by source hash) and load the shared library of all kernels."""
        if self._library is None:
            if self.sanitize and SANITIZER_RUNTIME[self.sanitize].split(".")[0] not in os.environ.get("LD_PRELOAD", ""):
                raise RuntimeError(f"Emulator(sanitize={self.sanitize!r}) needs its runtime preloaded: run "
                                   f"`python -m tinygrad_caps.kernels.emulation --sanitize {self.sanitize}`")
            self._library = ctypes.CDLL(str(self._build()))
        return self._library

    def _build(self) -> Path:
        sources = sorted(p.name for p in self.source_dir.glob("*.cu"))
        wrapper = wrapper_source(sources, self.source_dir)
        shim = (SOURCE_DIR / "cuda_shim.h").read_text()
        texts = [(self.source_dir / s).read_text() for s in sources]
        digest = hashlib.sha256("".join([wrapper, shim, str(self.sanitize)] + texts).encode()).hexdigest()[:16]
        self.build_dir.mkdir(parents=True, exist_ok=True)
        library = self.build_dir / f"kernels-{self.sanitize or 'plain'}-{digest}.so"
        if library.exists():
            return library
        cpp = self.build_dir / f"wrapper-{digest}.cpp"
        cpp.write_text(wrapper)
        tmp = library.with_suffix(f".{os.getpid()}.tmp")
        command = ["g++", "-std=c++20", "-O1", "-g", "-fPIC", "-shared", "-pthread", "-Wall", "-Wno-unused-function",
                   "-include", str(SOURCE_DIR / "cuda_shim.h"), *SANITIZER_FLAGS[self.sanitize], str(cpp), "-o", str(tmp)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the CPU emulation of {', '.join(sources)} failed:\n{result.stderr}")
        os.replace(tmp, library)
        return library

    def __call__(self, launch: KernelLaunch) -> None:
        function = getattr(self.library(), f"emu_{launch.kernel}")
        for index in launch.outputs:
            launch.args[index].fill(np.nan)
        keep, pointers = [], []
        for arg in launch.args:
            if isinstance(arg, np.ndarray):
                if not arg.flags.c_contiguous:
                    raise ValueError(f"{launch.kernel}: argument arrays must be C-contiguous")
                cell = ctypes.c_void_p(arg.ctypes.data)
            elif isinstance(arg, np.int32):
                cell = ctypes.c_int32(int(arg))
            elif isinstance(arg, np.float32):
                cell = ctypes.c_float(float(arg))
            elif isinstance(arg, np.float64):
                cell = ctypes.c_double(float(arg))
            else:
                raise TypeError(f"{launch.kernel}: unsupported kernel argument of type {type(arg).__name__}")
            keep.append(cell)
            pointers.append(ctypes.cast(ctypes.pointer(cell), ctypes.c_void_p))
        argv = (ctypes.c_void_p * len(pointers))(*pointers)
        grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
        block = tuple(launch.block) + (1,) * (3 - len(launch.block))
        function.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p]
        function(*grid, *block, argv)
        self.launches += 1


def selfcheck(runner) -> list[str]:
    """Run every kernel on small awkward shapes (partial blocks, B=1, float32 and float64) and
    compare with NumPy; returns a list of failures (empty when all agree)."""
    from . import capsule, conv, routing

    rng = np.random.default_rng(0)
    failures = []

    def compare(name, got, want, dtype):
        tol = 1e-5 if dtype == np.float32 else 1e-12
        if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
            failures.append(f"{name} ({np.dtype(dtype).name}): max error "
                            f"{np.nanmax(np.abs(got - want)) if got.shape == want.shape else 'shape'}")

    for dtype in (np.float32, np.float64):
        for b, i, j, d, k in ((1, 3, 2, 3, 2), (2, 5, 3, 2, 3)):
            u = rng.standard_normal((b, i, k)).astype(dtype)
            w = rng.standard_normal((i, j, d, k)).astype(dtype)
            g = rng.standard_normal((b, i, j, d)).astype(dtype)
            c = rng.standard_normal((b, i, j)).astype(dtype)
            v = rng.standard_normal((b, j, d)).astype(dtype)
            compare("capsule_predict", capsule.capsule_predict(u, w, runner, threads=32), np.einsum("ijdk,bik->bijd", w, u), dtype)
            compare("capsule_grad_u", capsule.capsule_grad_u(g, w, runner, threads=32), np.einsum("ijdk,bijd->bik", w, g), dtype)
            compare("capsule_grad_w", capsule.capsule_grad_w(g, u, runner, threads=32), np.einsum("bijd,bik->ijdk", g, u), dtype)
            compare("routing_weighted_sum", routing.routing_weighted_sum(c, g, runner), np.einsum("bij,bijd->bjd", c, g), dtype)
            compare("routing_agreement", routing.routing_agreement(g, v, runner, threads=32), np.einsum("bijd,bjd->bij", g, v), dtype)
        for shape, kernel, stride, padding in (((1, 2, 5, 4), (3, 2), (2, 1), (1, 0)), ((2, 1, 4, 4), (2, 2), (1, 1), (1, 1))):
            x = rng.standard_normal(shape).astype(dtype)
            for batch_last in (False, True):
                col = conv.im2col(x, kernel, stride, padding, batch_last, runner, threads=32)
                compare("im2col", col, reference_im2col(x, kernel, stride, padding, batch_last), dtype)
                r = rng.standard_normal(col.shape).astype(dtype)
                back = conv.col2im(r, shape, kernel, stride, padding, batch_last, runner, threads=32)
                compare("col2im (adjoint of im2col)", np.array([(x * back).sum()]), np.array([(col * r).sum()]), dtype)
    return failures


def reference_im2col(x, kernel, stride, padding, batch_last):
    """A loop-based im2col (the test oracle): rows (c, ky, kx), columns (oy, ox, n) or (n, oy, ox)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    col = np.zeros((c, kh, kw, n, oh, ow), x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            col[:, ky, kx] = padded[:, :, ky:ky + sh * oh:sh, kx:kx + sw * ow:sw].transpose(1, 0, 2, 3)
    if batch_last:
        col = col.transpose(0, 1, 2, 4, 5, 3)
    return col.reshape(c * kh * kw, n * oh * ow)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Check every kernel on the CPU emulation against NumPy.")
    parser.add_argument("--sanitize", choices=["thread", "address"], default=None)
    args = parser.parse_args(argv)
    if args.sanitize and SANITIZER_RUNTIME[args.sanitize].split(".")[0] not in os.environ.get("LD_PRELOAD", ""):
        env = dict(os.environ, LD_PRELOAD=sanitizer_runtime(args.sanitize))
        env["TSAN_OPTIONS"] = "halt_on_error=1 exitcode=66 report_signal_unsafe=0"
        env["ASAN_OPTIONS"] = "detect_leaks=0 halt_on_error=1 exitcode=66 verify_asan_link_order=0"
        command = [sys.executable, "-m", "tinygrad_caps.kernels.emulation", "--sanitize", args.sanitize]
        return subprocess.run(command, env=env).returncode
    failures = selfcheck(Emulator(sanitize=args.sanitize))
    for failure in failures:
        print("FAIL", failure)
    print(f"emulation{' under ' + args.sanitize + ' sanitizer' if args.sanitize else ''}: "
          f"{'all kernels agree with NumPy' if not failures else str(len(failures)) + ' failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
