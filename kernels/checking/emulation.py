"""Run our CUDA kernels on the CPU: the same .cu source, compiled with g++ behind ``cuda_shim.h``.

Each kernel gets a small generated C wrapper that takes the grid, the block, the dynamic shared
memory size and CUDA's ``void** args`` array, so a :class:`~tinygrad_caps.kernels.launch.KernelLaunch`
built by the ordinary launcher runs here unchanged: ``capsule_predict(u, W, runner=Emulator())``.

What is modelled (details in ``cuda_shim.h``): one fiber (or, under a sanitizer or with
``os_threads=True``, one OS thread) per CUDA thread; warps of 32 lanes
that meet in lockstep at ``__shfl*_sync``, ``__ballot_sync`` and ``__syncwarp`` with their masks
checked; ``float4``/``double2`` with an alignment check; dynamic shared memory of exactly the
launch's size; CUDA's launch limits (:func:`~tinygrad_caps.kernels.launch.check_launch_limits`);
and ``slots`` (default 2) blocks running at the same time, each slot on its own copy of the
library so static ``__shared__`` memory belongs to one block. ``max_blocks`` caps the grids the
launchers build, so grid-stride loops take several passes. Outputs are filled with NaN before each
launch, so an element the kernel never writes fails the comparison. A block whose threads all wait
forever (a ``__syncthreads`` some threads never reach while others wait at a shuffle) fails the
launch as a deadlock under fibers; with OS threads it hangs. Use small shapes: every CUDA thread
runs in software, and OS threads far slower than fibers (``benchmarks/emulation_speed.py`` measures both).
One build without a sanitizer serves fibers (either switch) and OS threads: the way is chosen per
launch; each sanitizer has a build of its own (OS threads only).

Sanitizers: ``Emulator(sanitize="thread")`` builds with ThreadSanitizer (a missing
``__syncthreads`` or ``__syncwarp``, a racy ``+=``, or two blocks writing one element are reported
even when results match) and ``sanitize="address"`` with AddressSanitizer (out-of-bounds reads,
shared memory past the launch's size). Their runtime must be loaded before Python starts, so run
them as ``python -m tinygrad_caps.kernels.checking.emulation --sanitize thread``, which re-executes itself
with the runtime preloaded and checks every kernel on small shapes.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..launch import SOURCE_DIR, KernelLaunch, check_launch_limits
from .reference import (reference_adam, reference_col2im, reference_im2col, reference_routing, reference_softmax,
                        reference_softmax_grad, reference_squash, reference_squash_grad)

# The sanitized builds at -O0 (after COMMON_FLAGS' -O1, so it wins): they compile in half the time, run
# the small checks they serve about as fast, and keep every access the source makes for the sanitizer.
SANITIZER_FLAGS = {None: [], "thread": ["-fsanitize=thread", "-O0"],
                   "address": ["-fsanitize=address", "-fno-omit-frame-pointer", "-O0"]}
SANITIZER_RUNTIME = {"thread": "libtsan.so", "address": "libasan.so"}
# Every build: misaligned float4/double2 accesses stop the process; one library copy per block
# slot must not share template statics (GNU unique symbols would merge them across copies); our
# thread-locals use static TLS (see sanitizer_environment); -g1: the line tables a sanitizer's report
# names lines with, at a third less compile time than -g under a sanitizer.
COMMON_FLAGS = ["-std=c++20", "-O1", "-g1", "-fPIC", "-shared", "-pthread", "-Wall", "-Wno-unused-function",
                "-fno-gnu-unique", "-fvisibility=hidden", "-ftls-model=initial-exec", "-fsanitize=alignment", "-fno-sanitize-recover=alignment"]
SHIM = Path(__file__).resolve().parent / "cuda_shim.h"  # CUDA's names for g++, included before each .cu
_MODE_OS_THREADS, _MODE_UCONTEXT = 1, 2  # a launch's mode bits (cuda_shim.h: mode_os_threads, mode_ucontext)
_KERNEL_SIGNATURE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(([^)]*)\)')


def sanitizer_environment(kind: str) -> dict:
    """os.environ plus what a Python process needs to load sanitized kernels: the sanitizer's
    runtime and libstdc++ preloaded (so their thread-local storage is static: ThreadSanitizer
    misreads glibc's reuse of dynamically allocated TLS as a race), and options that make the
    first report fail the process with exit code 66."""
    libstdcxx = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True,
                               check=True).stdout.strip()
    return dict(os.environ, LD_PRELOAD=f"{sanitizer_runtime(kind)} {libstdcxx}",
                TSAN_OPTIONS="halt_on_error=1 exitcode=66 report_signal_unsafe=0",
                ASAN_OPTIONS="detect_leaks=0 halt_on_error=1 exitcode=66 verify_asan_link_order=0")


class EmulationError(RuntimeError):
    """A kernel broke a rule the emulation checks (warp masks, divergent warp intrinsics)."""


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
    """C++ that includes each .cu and defines
    ``int emu_<kernel>(gx, gy, gz, bx, by, bz, shared_bytes, slot, slots, mode, void** args)``
    (mode: the bits of cuda_shim.h's mode_os_threads and mode_ucontext)."""
    lines = []
    for name in sources:
        lines.append(f'#include "{source_dir / name}"')
    for name in sources:
        for kernel, types in kernel_signatures((source_dir / name).read_text()).items():
            call = ", ".join(f"*({t}*)args[{i}]" for i, t in enumerate(types))
            lines.append(
                f'extern "C" __attribute__((visibility("default"))) int emu_{kernel}(unsigned gx, unsigned gy, '
                f"unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared_bytes, unsigned slot, "
                f"unsigned slots, unsigned mode, void** args) {{ return emu::launch(dim3(gx, gy, gz), "
                f"dim3(bx, by, bz), shared_bytes, slot, slots, mode, [args] {{ {kernel}({call}); }}); }}"
            )
    return "\n".join(lines) + "\n"


def sanitizer_runtime(kind: str) -> str:
    """Path of g++'s runtime library for a sanitizer ("thread" or "address")."""
    path = subprocess.run(["g++", f"-print-file-name={SANITIZER_RUNTIME[kind]}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not os.path.isabs(path):
        raise RuntimeError(f"g++ has no {SANITIZER_RUNTIME[kind]}; install its sanitizer runtime")
    return path


def _argument_cell(kernel, arg):
    if isinstance(arg, np.ndarray):
        if not arg.flags.c_contiguous:
            raise ValueError(f"{kernel}: argument arrays must be C-contiguous")
        return ctypes.c_void_p(arg.ctypes.data)
    for numpy_type, c_type in ((np.int32, ctypes.c_int32), (np.uint32, ctypes.c_uint32), (np.int64, ctypes.c_int64),
                               (np.float32, ctypes.c_float), (np.float64, ctypes.c_double)):
        if isinstance(arg, numpy_type):
            return c_type(arg.item())
    raise TypeError(f"{kernel}: unsupported kernel argument of type {type(arg).__name__}")


class Emulator:
    """A runner that executes KernelLaunch records on the CPU (see the module docstring).

    Args:
        sanitize: None, "thread" or "address". build_dir: where built libraries are cached.
        source_dir: folder of the .cu files (tests point it at planted-bug kernels).
        slots: how many blocks run at the same time (>= 1).
        max_blocks: the most blocks a launcher may put in a grid for this runner (None: CUDA's limits).
        os_threads: run each CUDA thread as an OS thread instead of a fiber. None: only under a
            sanitizer, which needs them (ThreadSanitizer sees races between OS threads).
        fiber_switch: "auto" (an x86-64 stack switch there, ucontext elsewhere) or "ucontext"
            (the portable switch, so that x86-64 machines test what ARM machines run).
    """

    def __init__(self, sanitize: str | None = None, build_dir: str | None = None, source_dir: str | None = None,
                 slots: int = 2, max_blocks: int | None = None, os_threads: bool | None = None,
                 fiber_switch: str = "auto"):
        if sanitize not in SANITIZER_FLAGS:
            raise ValueError(f"Emulator: sanitize must be None, 'thread' or 'address', got {sanitize!r}")
        if sanitize and os_threads is False:
            raise ValueError(f"Emulator: sanitize={sanitize!r} needs os_threads (the sanitizers watch OS threads)")
        self.os_threads = bool(sanitize) if os_threads is None else os_threads
        if fiber_switch not in ("auto", "ucontext"):
            raise ValueError(f"Emulator: fiber_switch must be 'auto' or 'ucontext', got {fiber_switch!r}")
        self.fiber_switch = fiber_switch
        if slots < 1 or (max_blocks is not None and max_blocks < 1):
            raise ValueError(f"Emulator: slots and max_blocks must be >= 1, got {slots} and {max_blocks}")
        self.sanitize = sanitize
        self.slots = slots
        self.max_blocks = max_blocks
        self.source_dir = Path(source_dir) if source_dir else SOURCE_DIR
        self.build_dir = Path(build_dir or os.environ.get("TINYGRAD_CAPS_EMULATION_DIR")
                              or Path(tempfile.gettempdir()) / "tinygrad-caps-emulation")
        self._libraries = []
        self._threads = None  # (process id, executor) for slots 1 and up; a forked child makes its own
        self.launches = []  # (kernel, grid, block, shared_mem) of every launch, for tests

    def _slot_threads(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._threads is None or self._threads[0] != os.getpid():
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(self.slots - 1, 1),
                                                         thread_name_prefix="emulation-slot")
            self._threads = (os.getpid(), pool)
        return self._threads[1]

    def libraries(self):
        """Build (once, cached by source hash) and load one copy of the kernel library per slot."""
        if not self._libraries:
            if self.sanitize and SANITIZER_RUNTIME[self.sanitize].split(".")[0] not in os.environ.get("LD_PRELOAD", ""):
                raise RuntimeError(f"Emulator(sanitize={self.sanitize!r}) needs its runtime preloaded: run "
                                   f"`python -m tinygrad_caps.kernels.checking.emulation --sanitize {self.sanitize}`")
            built = self._build()
            for slot in range(self.slots):
                # a distinct file per slot: the loader shares one loaded object per file
                copy = built.with_name(f"{built.stem}-slot{slot}.so")
                if not copy.exists():
                    tmp = copy.with_suffix(f".{os.getpid()}.tmp")
                    shutil.copyfile(built, tmp)
                    os.replace(tmp, copy)
                self._libraries.append(ctypes.CDLL(str(copy), mode=os.RTLD_LOCAL | os.RTLD_NOW))
        return self._libraries

    def _build(self) -> Path:
        """The kernel library of ``source_dir``'s .cu files for this runner's kind, built with g++ unless
        a build of the same sources, shim and flags is in ``build_dir`` (the key is their text, not
        the folder's path: identical planted kernels written to two temp folders share one build).
        Processes that need the same build at the same time build it once: the others wait."""
        sources = sorted(p.name for p in self.source_dir.glob("*.cu"))
        headers = sorted(p.name for p in self.source_dir.iterdir() if p.suffix in (".h", ".cuh"))
        wrapper = wrapper_source(sources, self.source_dir)
        texts = [f"{name}\n{(self.source_dir / name).read_text()}" for name in sources + headers]
        # one build without a sanitizer runs fibers (either switch) and OS threads, chosen per launch
        flags = COMMON_FLAGS + SANITIZER_FLAGS[self.sanitize] + ([] if self.sanitize else ["-DEMU_FIBERS"])
        # the wrapper without the folder's path: the generated launch functions are part of the build
        key = [SHIM.read_text(), " ".join(flags), wrapper.replace(str(self.source_dir), "")] + texts
        digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
        self.build_dir.mkdir(parents=True, exist_ok=True)
        kind = self.sanitize or "plain"
        library = self.build_dir / f"kernels-{kind}-{digest}.so"
        if library.exists():
            return library
        with open(self.build_dir / f"kernels-{kind}-{digest}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
            if library.exists():  # built by the process that held the lock
                return library
            cpp = self.build_dir / f"wrapper-{digest}.{os.getpid()}.cpp"
            tmp = library.with_suffix(f".{os.getpid()}.tmp")
            try:
                cpp.write_text(wrapper)
                command = ["g++", *flags, "-include", str(SHIM), str(cpp), "-o", str(tmp)]
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    raise RuntimeError(f"building the CPU emulation of {', '.join(sources)} failed:\n{result.stderr}")
                os.replace(tmp, library)
            finally:  # nothing left behind by a failed or interrupted build
                cpp.unlink(missing_ok=True)
                tmp.unlink(missing_ok=True)
        return library

    def __call__(self, launch: KernelLaunch) -> None:
        check_launch_limits(launch)
        grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
        block = tuple(launch.block) + (1,) * (3 - len(launch.block))
        if self.max_blocks is not None and grid[0] * grid[1] * grid[2] > self.max_blocks:
            raise ValueError(f"{launch.kernel}: grid {grid} exceeds this emulator's max_blocks={self.max_blocks}")
        libraries = self.libraries()
        for index in launch.outputs:
            launch.args[index].fill(np.nan)
        cells = [_argument_cell(launch.kernel, arg) for arg in launch.args]
        argv = (ctypes.c_void_p * len(cells))(*[ctypes.cast(ctypes.pointer(c), ctypes.c_void_p) for c in cells])
        slots = min(self.slots, grid[0] * grid[1] * grid[2])
        mode = (_MODE_OS_THREADS if self.os_threads else 0) | (_MODE_UCONTEXT if self.fiber_switch == "ucontext" else 0)
        codes = [None] * slots
        functions = []
        for library in libraries[:slots]:
            function = getattr(library, f"emu_{launch.kernel}")  # AttributeError: no such kernel
            function.argtypes = [ctypes.c_uint] * 10 + [ctypes.c_void_p]
            function.restype = ctypes.c_int
            functions.append(function)

        def run_slot(slot):
            codes[slot] = functions[slot](*grid, *block, launch.shared_mem, slot, slots, mode, argv)

        for library in libraries:
            library.emu_clear_error()
        # slot 0 on this thread, the others on the runner's own threads (ctypes lets go of the GIL
        # for the call): a thread started and joined per slot and launch cost more than small launches
        others = [self._slot_threads().submit(run_slot, slot) for slot in range(1, slots)]
        try:
            run_slot(0)
        finally:
            for other in others:
                other.result()
        self.launches.append((launch.kernel, grid, block, launch.shared_mem))
        if None in codes:
            raise EmulationError(f"{launch.kernel}: a block slot did not finish")
        if any(codes):
            messages = []
            for library in libraries:
                library.emu_last_error.restype = ctypes.c_char_p
                text = library.emu_last_error().decode()
                if text:
                    messages.append(text)
            raise EmulationError(f"{launch.kernel}: " + "; ".join(messages))


CAPSULE_CHECK_SHAPES = ((1, 3, 2, 3, 2), (3, 5, 3, 5, 3), (9, 4, 2, 8, 2))  # (B, I, J, D, K): tails, JD odd and % 4
ROUTING_CHECK_SHAPES = ((1, 3, 2, 3), (3, 9, 3, 8), (2, 5, 2, 64))   # (B, I, J, D): scalar and vector paths
CONV_CHECK_CASES = (((1, 2, 5, 4), (3, 2), (2, 1), (1, 0)), ((2, 1, 4, 4), (2, 2), (1, 1), (1, 1)),
                    ((1, 2, 7, 6), (3, 3), (3, 2), (2, 1)),
                    ((2, 1, 5, 5), (2, 2), (1, 1), (0, 0)))  # 32 columns: vector stores


def selfcheck(runner, to_device=np.asarray, to_host=np.asarray, threads: int = 32) -> list[str]:
    """Run every kernel on small awkward shapes (partial blocks and warps, vector and scalar paths,
    B=1, 32- and 64-bit indices, float32 and float64) and compare with NumPy; returns a list of
    failures (empty when all agree). ``to_device``/``to_host`` move arrays for a GPU runner."""
    from .. import activation, capsule, conv, optim, routing

    rng = np.random.default_rng(0)
    failures = []

    def compare(name, got, want, dtype):
        got = to_host(got)
        tol = 2e-5 if dtype == np.float32 else 1e-12
        if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
            failures.append(f"{name} ({np.dtype(dtype).name}): max error "
                            f"{np.nanmax(np.abs(got - want)) if got.shape == want.shape else 'shape'}")

    def draw(shape, dtype):
        return rng.standard_normal(shape).astype(dtype)

    for dtype in (np.float32, np.float64):
        for b, i, j, d, k in CAPSULE_CHECK_SHAPES:
            u, w, g = draw((b, i, k), dtype), draw((i, j, d, k), dtype), draw((b, i, j, d), dtype)
            du, dw, dg = to_device(u), to_device(w), to_device(g)
            compare("capsule_predict", capsule.capsule_predict(du, dw, runner, threads=threads),
                    np.einsum("ijdk,bik->bijd", w, u), dtype)
            grad_u, grad_w = capsule.capsule_grad(dg, du, dw, runner, threads=max(threads, 64))
            compare("capsule_grad (u)", grad_u, np.einsum("ijdk,bijd->bik", w, g), dtype)
            compare("capsule_grad (W)", grad_w, np.einsum("bijd,bik->ijdk", g, u), dtype)
            compare("capsule_grad_u", capsule.capsule_grad_u(dg, dw, runner, threads=threads),
                    np.einsum("ijdk,bijd->bik", w, g), dtype)
            compare("capsule_grad_w", capsule.capsule_grad_w(dg, du, runner, threads=threads),
                    np.einsum("bijd,bik->ijdk", g, u), dtype)
        for b, i, j, d in ROUTING_CHECK_SHAPES:
            u_hat, c, v = draw((b, i, j, d), dtype), draw((b, i, j), dtype), draw((b, j, d), dtype)
            du_hat = to_device(u_hat)
            compare("routing_weighted_sum", routing.routing_weighted_sum(to_device(c), du_hat, runner, threads=threads),
                    np.einsum("bij,bijd->bjd", c, u_hat), dtype)
            compare("routing_agreement", routing.routing_agreement(du_hat, to_device(v), runner, threads=threads),
                    np.einsum("bijd,bjd->bij", u_hat, v), dtype)
            v_out, c_out, logits = routing.routing_forward(du_hat, 3, 1e-8, runner, threads=threads)
            want_v, want_c, want_logits = reference_routing(u_hat, 3, 1e-8)
            compare("routing_forward (v)", v_out, want_v, dtype)
            compare("routing_forward (c)", c_out, want_c, dtype)
            compare("routing_forward (logits)", logits, want_logits, dtype)
            for slices in (1, 2, 3):  # the sliced kernel: S blocks per example, the last one shorter
                for name, got, want in zip(("v", "c", "logits"),
                                           routing.routing_forward(du_hat, 3, 1e-8, runner, threads=threads, slices=slices),
                                           (want_v, want_c, want_logits)):
                    compare(f"routing_forward, {slices} slices ({name})", got, want, dtype)
            p, q = draw((3, b, i, j), dtype), draw((3, b, j, d), dtype)
            for wide in (False, True):
                compare(f"routing_outer_products ({64 if wide else 32}-bit)",
                        routing.routing_outer_products(to_device(p), to_device(q), runner, threads, wide_indices=wide),
                        np.einsum("tbij,tbjd->bijd", p, q), dtype)
            # the row-wise activations, over u_hat's rows of D values
            g_hat, y = draw(u_hat.shape, dtype), reference_softmax(u_hat)
            dg_hat, dy = to_device(g_hat), to_device(y.astype(dtype))
            compare("squash_rows", activation.squash_rows(du_hat, 1e-8, runner, threads), reference_squash(u_hat, 1e-8),
                    dtype)
            compare("squash_rows_grad", activation.squash_rows_grad(du_hat, dg_hat, 1e-8, runner, threads),
                    reference_squash_grad(u_hat, g_hat, 1e-8), dtype)
            compare("softmax_rows", activation.softmax_rows(du_hat, runner, threads), y, dtype)
            compare("softmax_rows_grad", activation.softmax_rows_grad(dy, dg_hat, runner, threads),
                    reference_softmax_grad(y, g_hat), dtype)
        for size, amsgrad, decoupled in ((1, False, False), (37, True, False), (300, True, True)):
            state = [draw((size,), dtype) for _ in range(5)]
            state[3], state[4] = np.abs(state[3]), np.abs(state[4])  # second moments are never negative
            on_device = [to_device(a.copy()) for a in state]  # updated in place
            hyper = dict(step=3, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, decoupled=decoupled)
            optim.adam_step(*on_device[:4], on_device[4] if amsgrad else None, **hyper, runner=runner, threads=threads)
            want = reference_adam(*state[:4], state[4] if amsgrad else None, **hyper)
            for name, got, expected in zip(("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), on_device[:1] + on_device[2:], want):
                if expected is not None:
                    compare(f"adam_step ({name})", got, expected, dtype)
            # the capturable form: the rate and the count (the steps before this one) read on the device
            on_device = [to_device(a.copy()) for a in state]
            counts = to_device(np.array([7, hyper["step"] - 1], dtype=np.int32))
            rate = to_device(np.array([hyper["lr"]]))
            optim.adam_step_capturable(*on_device[:4], on_device[4] if amsgrad else None, counts[1:], rate,
                                       hyper["betas"], hyper["eps"], hyper["weight_decay"], decoupled, runner, threads)
            for name, got, expected in zip(("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), on_device[:1] + on_device[2:], want):
                if expected is not None:
                    compare(f"adam_step_capturable ({name})", got, expected, dtype)
            optim.increment_counts(counts, runner, threads)
            if to_host(counts).tolist() != [8, hyper["step"]]:
                failures.append(f"increment_counts ({dtype.__name__}): {to_host(counts).tolist()}")
        for shape, kernel, stride, padding in CONV_CHECK_CASES:
            x = draw(shape, dtype)
            for batch_last in (False, True):
                for bits in (32, 64):
                    col = conv.im2col(to_device(x), kernel, stride, padding, batch_last, runner, threads, bits)
                    compare(f"im2col ({bits}-bit)", col, reference_im2col(x, kernel, stride, padding, batch_last), dtype)
                    if bits == 32 and not batch_last:  # the kernels beside im2col_planes
                        compare("im2col (one element per thread)",
                                conv.im2col(to_device(x), kernel, stride, padding, False, runner, threads, 32,
                                            by_rows=False), reference_im2col(x, kernel, stride, padding, False), dtype)
                        compare("im2col_rows",
                                conv.im2col(to_device(x), kernel, stride, padding, False, runner, threads, 32,
                                            planes=False), reference_im2col(x, kernel, stride, padding, False), dtype)
                    r = draw(tuple(col.shape), dtype)
                    back = conv.col2im(to_device(r), shape, kernel, stride, padding, batch_last, runner, threads, bits)
                    compare(f"col2im ({bits}-bit)", back, reference_col2im(r, shape, kernel, stride, padding, batch_last),
                            dtype)
    return failures


def main(argv=None) -> int:
    """Check every kernel on the CPU emulation (optionally sanitized); returns the exit status."""
    parser = argparse.ArgumentParser(description="Check every kernel on the CPU emulation against NumPy.")
    parser.add_argument("--sanitize", choices=["thread", "address"], default=None)
    args = parser.parse_args(argv)
    if args.sanitize and SANITIZER_RUNTIME[args.sanitize].split(".")[0] not in os.environ.get("LD_PRELOAD", ""):
        env = sanitizer_environment(args.sanitize)
        command = [sys.executable, "-m", "tinygrad_caps.kernels.checking.emulation", "--sanitize", args.sanitize]
        return subprocess.run(command, env=env).returncode
    # three blocks at most, two at a time: every grid-stride loop takes several passes
    failures = selfcheck(Emulator(sanitize=args.sanitize, slots=2, max_blocks=3))
    for failure in failures:
        print("FAIL", failure)
    print(f"emulation{' under ' + args.sanitize + ' sanitizer' if args.sanitize else ''}: "
          f"{'all kernels agree with NumPy' if not failures else str(len(failures)) + ' failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
