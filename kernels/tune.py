"""Kernel variants chosen by measurement on the GPU that runs them, and kept on disk.

Several kernels come in variants that compute the same thing in different ways (``KERNELS``): which
is fastest depends on the GPU, the shapes and the dtype, and a choice made on one GPU without
measuring can be several times slower on another (an H200 measured the register capsule_predict,
then the default, at 0.119 of its copy bandwidth and the shared-memory one at 0.462). So a launcher
called with its variant options left at None asks :func:`choose`, which:

1. returns the choice already made in this process for (GPU name, kernel, shapes, dtype), or the
   one on disk (``<TUNE_DIR>/<gpu>.json``, made by an earlier process on a GPU of that name, for
   the same kernel source);
2. else, on a GPU, outside any CUDA-graph capture, with the GPU runner, times every variant that
   can run for these shapes (each launched once, its launches then replayed back to back between
   CUDA events, best of TIMED_ROUNDS rounds of TIMED_REPEATS), drops any that fails or whose result
   differs from the default's, keeps the fastest (the default on a tie), and writes it to disk;
3. else (NumPy arrays on the CPU emulation, a runner of one's own, a capture in progress, or
   ``TINYGRAD_CAPS_KERNEL_TUNING=off``) returns the kernel's fixed default.

A captured step's warm-up calls run eagerly, so they tune; the capture then finds the choices made.
Choices depend on timings, so the last bits of a float32 result may differ between two machines
(never between two runs that share a cache); ``TINYGRAD_CAPS_KERNEL_TUNING=off`` gives the fixed
defaults everywhere.

The cache lives beside CuPy's kernel cache: ``$TINYGRAD_CAPS_TUNE_DIR``, else the folder
``tinygrad_caps_tune`` next to ``CUPY_CACHE_DIR`` (default ``~/.cupy/tinygrad_caps_tune``), one JSON
file per GPU name. An unreadable file is ignored with a warning (and rewritten at the next choice);
a choice made for another version of the kernel's source is measured again.

Ahead of time, for the shapes of the paper's CapsNet (or others)::

    python -m tinygrad_caps.kernels.tune [--batch 32 100] [--dtype float32] [--device 0] [--retune]

prints each candidate's time and the choice.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
import re
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

from .device import array_module, cupy_module, is_cupy_array

ENV_SWITCH = "TINYGRAD_CAPS_KERNEL_TUNING"  # "on" (default) or "off": the fixed defaults, no measuring
ENV_DIR = "TINYGRAD_CAPS_TUNE_DIR"
CACHE_FORMAT = 1
TIMED_REPEATS = 5  # replays of a variant's launches between two CUDA events
TIMED_ROUNDS = 3   # such measurements per variant; the best counts
# Results of two variants agree when |a - b| <= RTOL |b| + ATOL max|b| (summation orders differ).
RTOL, ATOL = 1e-3, 1e-4


@dataclasses.dataclass(frozen=True)
class TunedKernel:
    """A kernel with several variants: ``variants`` {name: what it does}, in the order they are tried;
    ``default`` the fixed one (tuning off, no GPU, a capture with no choice yet) and ``default_why``."""

    name: str
    source: str
    variants: dict
    default: str
    default_why: str


KERNELS = {k.name: k for k in (
    TunedKernel("capsule_predict", "capsule.cu", {
        "shared": "W[i] in shared memory, one block per input capsule, 256 threads (capsule_predict_shared)",
        "registers": "W[i]'s column groups in registers, blocks (i, chunk of B), 256 threads (capsule_predict)",
        "registers-128": "the register kernel with 128 threads per block",
        "registers-512": "the register kernel with 512 threads per block"},
        "shared", "measured on an H200 (2026-11-28): 0.462 of the copy bandwidth against the register kernel's "
                  "0.119 at CapsNet's sizes, B=100"),
    TunedKernel("capsule_grad", "capsule.cu", {
        "one-pass": "both adjoints in one pass over g, sums in registers, tiles of g in shared memory (capsule_grad)",
        "shared": "both adjoints in one pass, W[i] and grad_W[i] in shared memory (capsule_grad_shared)",
        "split": "grad_u and grad_W by a kernel each (capsule_grad_u, capsule_grad_w)"},
        "one-pass", "the kernel in use before tuning; no device measurement put another ahead of it"),
    TunedKernel("routing_forward", "routing.cu", {
        "heuristic": "routing.choose_forward_slices: S slices per example from B, I and the SM count "
                     "(one block and one launch where that is one slice and u_hat[b] is small)",
        "one-block": "one block per example, every iteration in one launch",
        "half-slices": "half the heuristic's slices per example (at least one), one launch per iteration",
        "double-slices": "twice the heuristic's slices per example (at most I), one launch per iteration"},
        "heuristic", "the heuristic in use before tuning"),
    TunedKernel("im2col", "im2col.cu", {
        "planes": "a group of images' planes of one channel staged in shared memory (im2col_planes)",
        "rows": "a grid row per row of the column matrix, four columns per thread (im2col_rows)",
        "elements": "one element per thread, grid-stride (im2col_i32 / im2col)"},
        "planes", "the kernel in use before tuning (H200, 2026-11-28: 0.616 of the copy bandwidth)"),
    TunedKernel("routing_agreement", "routing.cu", {
        "threads-256": "256 threads per block", "threads-128": "128 threads per block",
        "threads-512": "512 threads per block"},
        "threads-256", "the block size in use before tuning"),
)}


class TuningCacheWarning(RuntimeWarning):
    """The tuning cache could not be read (it is ignored) or written (choices stay in this process)."""


@dataclasses.dataclass
class Choice:
    """One kernel's variant for one (GPU, shapes, dtype). ``how``: "tuned" (measured now), "cached"
    (this process or the disk), "default" (with ``reason``). ``seconds``: each timed variant's
    seconds per call; ``failed``: {variant: why it was not chosen}."""

    kernel: str
    key: str
    variant: str
    how: str
    seconds: dict = dataclasses.field(default_factory=dict)
    failed: dict = dataclasses.field(default_factory=dict)
    reason: str = ""


def tuning_enabled() -> bool:
    """Whether launchers may measure (``TINYGRAD_CAPS_KERNEL_TUNING``: "on", the default, or "off")."""
    value = os.environ.get(ENV_SWITCH, "on").strip().lower()
    if value in ("on", "1", ""):
        return True
    if value in ("off", "0"):
        return False
    raise ValueError(f"{ENV_SWITCH} must be 'on' or 'off', got {os.environ[ENV_SWITCH]!r}")


def tune_dir() -> Path:
    """Where choices are kept: ``$TINYGRAD_CAPS_TUNE_DIR``, else ``tinygrad_caps_tune`` beside CuPy's kernel cache."""
    given = os.environ.get(ENV_DIR)
    if given:
        return Path(given).expanduser()
    from .warmup import cupy_cache_dir

    return cupy_cache_dir().parent / "tinygrad_caps_tune"


def cache_key(dtype, shapes) -> str:
    """The key of a choice for ``shapes`` (a tuple of sizes and tuples) and ``dtype``: "float32 (100, 1152, 8) ..."."""
    return f"{np.dtype(dtype).name} {' '.join(str(tuple(s)) if isinstance(s, (tuple, list)) else str(s) for s in shapes)}"


@functools.lru_cache(maxsize=None)
def code_digest(kernel: str) -> str:
    """A digest of ``kernel``'s source file and variant names: a choice made for other code is not reused."""
    from .launch import source_text

    spec = KERNELS[kernel]
    text = source_text(spec.source) + "\n" + "\n".join(spec.variants)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _slug(gpu: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "gpu"


def agree(a, b) -> bool:
    """Whether two variants' outputs (an array or a tuple of arrays) are the same up to summation order."""
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(agree(x, y) for x, y in zip(a, b))
    if tuple(a.shape) != tuple(b.shape):
        return False
    if a.size == 0:
        return True
    xp = array_module(b)
    scale = float(xp.nanmax(xp.abs(b))) if b.size else 0.0
    scale = scale if math.isfinite(scale) else 0.0
    return bool(xp.allclose(a, b, rtol=RTOL, atol=ATOL * scale, equal_nan=True))


def _copy(outputs):
    """A copy of a variant's outputs (its launches replayed for timing write them again)."""
    if isinstance(outputs, (tuple, list)):
        return tuple(_copy(o) for o in outputs)
    return outputs.copy()


def gpu_timer(name: str, replay) -> float:
    """Seconds per ``replay()`` (a variant's launches, back to back) on the current stream: the best of
    TIMED_ROUNDS rounds of TIMED_REPEATS replays between two CUDA events."""
    cupy = cupy_module()
    best = math.inf
    for _ in range(TIMED_ROUNDS):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(TIMED_REPEATS):
            replay()
        stop.record()
        stop.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3 / TIMED_REPEATS)
    return best


class Tuner:
    """Choices of kernel variants with their cache on disk (``directory``, default :func:`tune_dir`),
    measured with ``timer(variant, replay) -> seconds`` (default :func:`gpu_timer`)."""

    def __init__(self, directory=None, timer=None, remeasure: bool = False):
        self.directory = Path(directory) if directory is not None else tune_dir()
        self.timer = timer or gpu_timer
        self.remeasure = remeasure  # True: a choice not measured by this tuner counts as none
        self._files = {}  # gpu -> {kernel: {key: entry}}, as read (or written) by this process
        self._measured = set()  # (gpu, kernel, key) measured by this tuner
        self._lock = threading.RLock()
        self._unwritable = False

    def path(self, gpu: str) -> Path:
        """The cache file of the GPUs called ``gpu``."""
        return self.directory / f"{_slug(gpu)}.json"

    def _read(self, gpu: str) -> dict:
        path = self.path(gpu)
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            kernels = data["kernels"]
            if data.get("format") != CACHE_FORMAT or not isinstance(kernels, dict) or not all(
                    isinstance(entries, dict) and all(isinstance(e, dict) and isinstance(e.get("variant"), str)
                                                      for e in entries.values()) for entries in kernels.values()):
                raise ValueError("not a kernel tuning cache of this version")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"kernel tuning: ignoring the unreadable cache file {path} ({type(exc).__name__}: {exc}); "
                          f"the kernels are measured again and the file rewritten", TuningCacheWarning, stacklevel=3)
            return {}
        return kernels

    def _entries(self, gpu: str) -> dict:
        if gpu not in self._files:
            self._files[gpu] = self._read(gpu)
        return self._files[gpu]

    def lookup(self, gpu: str, kernel: str, key: str, candidates=None) -> Choice | None:
        """The choice kept for (``gpu``, ``kernel``, ``key``) for this kernel source, or None (a
        choice not among ``candidates``, when given, counts as none)."""
        with self._lock:
            entry = self._entries(gpu).get(kernel, {}).get(key)
        if self.remeasure and (gpu, kernel, key) not in self._measured:
            return None
        if entry is None or entry.get("code") != code_digest(kernel) or entry["variant"] not in KERNELS[kernel].variants:
            return None
        if candidates is not None and entry["variant"] not in candidates:
            return None
        return Choice(kernel, key, entry["variant"], "cached", dict(entry.get("seconds") or {}),
                      dict(entry.get("failed") or {}))

    def forget(self, gpu: str, kernel: str, key: str) -> None:
        """Drop the choice for (``gpu``, ``kernel``, ``key``) from this process (the file keeps it
        until a new one is written)."""
        with self._lock:
            self._entries(gpu).get(kernel, {}).pop(key, None)

    def tune(self, gpu: str, kernel: str, key: str, candidates: dict, runner=None) -> Choice:
        """Measure ``candidates`` ({variant: run(runner) -> outputs}) and keep the fastest that runs and
        agrees with the default's result (the first candidate's that runs, where the default does not);
        the default on a tie. Each variant runs once (its result compared), then its launches are
        replayed by the timer. ``runner`` executes launch records (None: nothing is launched, as in
        the tests' fake runs). Raises RuntimeError when no variant runs."""
        spec = KERNELS[kernel]
        order = [v for v in spec.variants if v in candidates]
        unknown = set(candidates) - set(order)
        if unknown:
            raise ValueError(f"kernel tuning: {kernel} has no variant {sorted(unknown)}; it has {list(spec.variants)}")
        seconds, failed = {}, {}
        reference = None  # (variant, a copy of its outputs): the default's where it runs
        for variant in order:
            records = []

            def recording(launch, records=records):
                records.append(launch)
                if runner is not None:
                    runner(launch)

            def replay(records=records):
                for launch in records:
                    if runner is not None:
                        runner(launch)

            try:
                outputs = candidates[variant](recording)
                if reference is None:
                    reference = (variant, _copy(outputs))
                elif not agree(outputs, reference[1]):
                    failed[variant] = f"its result differs from the {reference[0]} variant's"
                    continue
                took = float(self.timer(variant, replay))
            except Exception as exc:  # noqa: BLE001  (a variant that cannot run is never chosen; said below)
                failed[variant] = f"{type(exc).__name__}: {exc}"
                continue
            if not math.isfinite(took) or took <= 0:
                failed[variant] = f"its time could not be measured ({took})"
                continue
            seconds[variant] = took
        for variant, why in failed.items():
            warnings.warn(f"kernel tuning: {kernel} variant {variant} on {gpu} for {key} is not chosen: {why}",
                          RuntimeWarning, stacklevel=3)
        if not seconds:
            raise RuntimeError(f"kernel tuning: no variant of {kernel} runs on {gpu} for {key}: {failed}")
        fastest = min(seconds.values())
        variant = next(v for v in order if seconds.get(v) == fastest)  # the default first on a tie
        if spec.default in seconds and seconds[spec.default] == fastest:
            variant = spec.default
        choice = Choice(kernel, key, variant, "tuned", seconds, failed)
        self._save(gpu, choice)
        return choice

    def _save(self, gpu: str, choice: Choice) -> None:
        entry = {"variant": choice.variant, "seconds": choice.seconds, "failed": choice.failed,
                 "code": code_digest(choice.kernel),
                 "tuned": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        with self._lock:
            self._entries(gpu).setdefault(choice.kernel, {})[choice.key] = entry
            self._measured.add((gpu, choice.kernel, choice.key))
            if self._unwritable:
                return
            path = self.path(gpu)
            try:
                with warnings.catch_warnings():  # a file another process left unreadable is replaced
                    warnings.simplefilter("ignore", TuningCacheWarning)
                    on_disk = self._read(gpu)  # what other processes wrote meanwhile
                for kernel, entries in self._files[gpu].items():
                    on_disk.setdefault(kernel, {}).update(entries)
                self._files[gpu] = on_disk
                path.parent.mkdir(parents=True, exist_ok=True)
                text = json.dumps({"format": CACHE_FORMAT, "gpu": gpu, "kernels": on_disk}, indent=1, sort_keys=True)
                handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
                with os.fdopen(handle, "w") as out:
                    out.write(text + "\n")
                os.replace(temporary, path)
            except OSError as exc:
                self._unwritable = True
                warnings.warn(f"kernel tuning: cannot write {path} ({exc}); choices stay in this process "
                              f"(set {ENV_DIR} to a writable folder)", TuningCacheWarning, stacklevel=3)


_tuner = None
_tuner_lock = threading.Lock()
_notes = threading.local()


def process_tuner() -> Tuner:
    """The Tuner the launchers use (made at the first choice, with :func:`tune_dir` as it is then)."""
    global _tuner
    with _tuner_lock:
        if _tuner is None:
            _tuner = Tuner()
        return _tuner


@contextlib.contextmanager
def using_tuner(tuner: Tuner):
    """Within this context the launchers' choices go through ``tuner`` (a fake timer's, in tests)."""
    global _tuner
    with _tuner_lock:
        previous, _tuner = _tuner, tuner
    try:
        yield tuner
    finally:
        with _tuner_lock:
            _tuner = previous


@contextlib.contextmanager
def recording():
    """Collect the Choice of every :func:`choose` made in this thread within the context (a list)."""
    previous = getattr(_notes, "log", None)
    _notes.log = log = []
    try:
        yield log
    finally:
        _notes.log = previous


def _noted(choice: Choice) -> str:
    log = getattr(_notes, "log", None)
    if log is not None:
        log.append(choice)
    return choice.variant


@functools.lru_cache(maxsize=None)
def gpu_name(device_id: int) -> str:
    """The name CUDA reports for GPU ``device_id``."""
    name = cupy_module().cuda.runtime.getDeviceProperties(device_id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _capturing() -> bool:
    stream = cupy_module().cuda.get_current_stream()
    return bool(getattr(stream, "is_capturing", lambda: False)())


def choose(kernel: str, array, shapes, candidates: dict, runner) -> str:
    """The variant of ``kernel`` to launch for ``array`` (the launch's first array: its GPU and dtype)
    and ``shapes``; ``candidates`` {variant: run(runner) -> outputs} are the variants that can run for
    them, ``runner`` the launcher's runner. See the module docstring for the order of the rules."""
    spec = KERNELS[kernel]
    if not candidates:
        raise ValueError(f"kernel tuning: no variant of {kernel} can run here")
    default = spec.default if spec.default in candidates else next(v for v in spec.variants if v in candidates)
    key = cache_key(array.dtype, shapes)
    if not is_cupy_array(array):
        return _noted(Choice(kernel, key, default, "default", reason="not on a GPU"))
    if not tuning_enabled():
        return _noted(Choice(kernel, key, default, "default", reason=f"{ENV_SWITCH}=off"))
    from .launch import run_on_gpu

    tuner = process_tuner()
    gpu = gpu_name(array.device.id)
    known = tuner.lookup(gpu, kernel, key, candidates)
    if known is not None:
        return _noted(known)
    if len(candidates) == 1:
        return _noted(Choice(kernel, key, default, "default", reason="the only variant that runs for these shapes"))
    if runner is not run_on_gpu:
        return _noted(Choice(kernel, key, default, "default", reason="a runner of the caller's own measures nothing"))
    if _capturing():
        return _noted(Choice(kernel, key, default, "default", reason="a CUDA graph is being captured"))
    with array.device:
        return _noted(tuner.tune(gpu, kernel, key, candidates, run_on_gpu))


# ----- ahead of time: python -m tinygrad_caps.kernels.tune -----
def capsnet_shapes(batch: int, image_size=28, kernel_size=9, conv1_channels=256, primary_types=32, primary_dim=8,
                   classes=10, digit_dim=16) -> dict:
    """The arrays' shapes at which a CapsNet of these sizes (the paper's by default) calls each tuned
    kernel: {"u", "W", "u_hat", "v", "conv1", "primary"} (the two convolutions' images)."""
    conv1_side = image_size - kernel_size + 1
    primary_side = (conv1_side - kernel_size) // 2 + 1
    capsules = primary_types * primary_side * primary_side
    return {"u": (batch, capsules, primary_dim), "W": (capsules, classes, digit_dim, primary_dim),
            "u_hat": (batch, capsules, classes, digit_dim), "v": (batch, classes, digit_dim),
            "conv1": (batch, 1, image_size, image_size), "primary": (batch, conv1_channels, conv1_side, conv1_side)}


def tune_capsnet(shapes: dict, dtype, kernel_size: int = 9, iterations: int = 3) -> list:
    """Call every tuned kernel once at a CapsNet's ``shapes`` (capsnet_shapes) on the current GPU, on
    random arrays of ``dtype``: each measures its variants unless a choice is kept. Returns the Choices."""
    from . import capsule, conv, routing

    cupy = cupy_module()
    rng = np.random.default_rng(0)

    def draw(shape, scale=1.0):
        return cupy.asarray((rng.standard_normal(shape) * scale).astype(dtype))

    u, w, u_hat, v = draw(shapes["u"]), draw(shapes["W"], 0.05), draw(shapes["u_hat"]), draw(shapes["v"])
    with recording() as log:
        capsule.capsule_predict(u, w)
        capsule.capsule_grad(u_hat, u, w)
        routing.routing_agreement(u_hat, v)
        routing.routing_forward(u_hat, iterations)
        for image, stride in ((shapes["conv1"], 1), (shapes["primary"], 2)):
            conv.im2col(draw(image), (kernel_size, kernel_size), (stride, stride), (0, 0), False)
    cupy.cuda.Device().synchronize()
    return log


def describe(choice: Choice) -> str:
    """One line: the kernel, its shapes, each candidate's time (the chosen one starred) and how."""
    times = ", ".join(f"{name} {seconds * 1e6:.1f} us{'*' if name == choice.variant else ''}"
                      for name, seconds in choice.seconds.items())
    failed = "".join(f"; {name} failed: {why}" for name, why in choice.failed.items())
    how = choice.how + (f": {choice.reason}" if choice.reason else "")
    return f"  {choice.kernel:<17} {choice.key}: {times or '(not timed)'}{failed} -> {choice.variant} ({how})"


def main(argv=None) -> int:
    """Tune the kernels ahead of time for a CapsNet's shapes; returns 0, or 2 without a GPU."""
    import argparse
    import sys

    from .warmup import device_index
    from .device import DeviceError

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="GPU index or cuda:N (default: the current GPU)")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 100])
    parser.add_argument("--dtype", nargs="+", choices=["float32", "float64"], default=["float32"])
    parser.add_argument("--retune", action="store_true", help="measure again, even where a choice is kept")
    for flag, default in (("--image-size", 28), ("--kernel-size", 9), ("--conv1-channels", 256), ("--primary-types", 32),
                          ("--primary-dim", 8), ("--classes", 10), ("--digit-dim", 16), ("--iterations", 3)):
        parser.add_argument(flag, type=int, default=default, help=f"the CapsNet's size (default {default}: the paper's)")
    args = parser.parse_args(argv)
    if min(args.batch) < 1 or min(args.image_size, args.kernel_size, args.conv1_channels, args.primary_types,
                                   args.primary_dim, args.classes, args.digit_dim, args.iterations) < 1:
        print("tune: --batch and the sizes must be at least 1", file=sys.stderr)
        return 2
    if (args.image_size - args.kernel_size + 1 - args.kernel_size) // 2 + 1 < 1:
        print(f"tune: --image-size {args.image_size} is too small for two {args.kernel_size}x{args.kernel_size} "
              f"convolutions", file=sys.stderr)
        return 2
    try:
        tuning_enabled()
        index = device_index(args.device if args.device is None or args.device.startswith("cuda") else int(args.device))
    except (DeviceError, ValueError) as exc:
        print(f"tune: {exc}", file=sys.stderr)
        return 2
    if not tuning_enabled():
        print(f"tune: {ENV_SWITCH}=off: the kernels take their fixed defaults and nothing is measured", file=sys.stderr)
        return 2
    cupy = cupy_module()
    tuner = Tuner(remeasure=args.retune)
    sizes = dict(image_size=args.image_size, kernel_size=args.kernel_size, conv1_channels=args.conv1_channels,
                 primary_types=args.primary_types, primary_dim=args.primary_dim, classes=args.classes,
                 digit_dim=args.digit_dim)
    with cupy.cuda.Device(index), using_tuner(tuner):
        gpu = gpu_name(index)
        for dtype in args.dtype:
            for batch in args.batch:
                print(f"cuda:{index} {gpu}, {dtype}, B={batch} (choices kept in {tuner.path(gpu)})")
                for choice in tune_capsnet(capsnet_shapes(batch, **sizes), np.dtype(dtype), args.kernel_size,
                                           args.iterations):
                    print(describe(choice))
    return 0


if __name__ == "__main__":
    # ``python -m`` runs this file a second time, as __main__: the launchers choose through the module
    # itself, so its main() (and its process tuner) must be the one that runs
    from tinygrad_caps.kernels import tune as _module

    raise SystemExit(_module.main())
