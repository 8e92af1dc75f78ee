"""Where a first training step's seconds go on a fresh machine: a timeline of one process that imports
the package, makes the CUDA context, seeds (CuPy's cuRAND generator), sets up cuBLAS, compiles our
kernel modules (NVRTC, in parallel: each module's seconds), builds the model on the GPU, runs two eager
steps (CuPy compiles its own elementwise and reduction kernels at their first use, and our kernels
with variants are measured: kernels/tune.py), captures the step as a CUDA graph and replays it.

Each run is a process of its own: ``cold`` with CuPy's kernel cache and the tuning cache empty (a fresh
machine), ``warm`` with the caches the cold run left (a second run on the same machine). Per phase: its
start and seconds, and the kernel cache files it added, told apart as ours (they hold one of our
kernel names) or CuPy's own; the tuning's seconds per kernel. The first epoch's cold seconds are about
the phases' sum plus the epoch's replays: this says which phase to cut.

    python benchmarks/cold_start.py [--device cuda] [--batch 100] [--model full|reduced|tiny]
                                    [--runs cold warm] [--replays 20] [--json]

Needs a GPU (``--model tiny`` runs on the CPU stand-in for CuPy, for the smoke test).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
RUNS = ("cold", "warm")


def our_kernel_names() -> set:
    """Every extern "C" kernel of kernels/*.cu (how a cache file is told to be ours)."""
    from tinygrad_caps.kernels import launch, modules

    return {name for source in launch.cuda_sources() for name in modules.kernel_names(source)}


class Timeline:
    """Phases of this process: each with its start and seconds (from the script's start), the kernel
    cache files it added (ours or CuPy's own) and details."""

    def __init__(self, cache: Path):
        self.cache, self.phases, self._ours = cache, [], None

    def _files(self) -> set:
        return set(os.listdir(self.cache)) if self.cache.is_dir() else set()

    def _split(self, added) -> dict:
        if self._ours is None:
            self._ours = {name.encode() for name in our_kernel_names()}
        ours = sum(1 for name in added if any(k in (self.cache / name).read_bytes() for k in self._ours))
        return {"ours": ours, "cupy": len(added) - ours}

    def phase(self, name: str, action, **detail):
        """Run ``action()`` as the phase ``name``; returns its result."""
        before, start = self._files(), time.perf_counter()
        result = action()
        sync()
        seconds = time.perf_counter() - start
        added = self._files() - before
        self.phases.append({"phase": name, "start_s": round(start - T0, 4), "seconds": round(seconds, 4),
                            "new_cache_files": self._split(added), **detail})
        return result


def sync():
    from tinygrad_caps.backend import cupy_module

    cupy = cupy_module()
    if cupy is not None and "cupy" in sys.modules:
        cupy.cuda.Device().synchronize()


class TimedTuner:
    """The process's kernel tuner, with the seconds each measurement took."""

    def __new__(cls):
        from tinygrad_caps.kernels import tune

        class Timed(tune.Tuner):
            seconds = {}

            def tune(self, gpu, kernel, key, candidates, runner=None):
                start = time.perf_counter()
                try:
                    return super().tune(gpu, kernel, key, candidates, runner)
                finally:
                    self.seconds[f"{kernel} {key}"] = round(time.perf_counter() - start, 4)

        return Timed()


def child(args) -> dict:
    """One process's timeline (see the module docstring)."""
    cache = Path(os.environ["CUPY_CACHE_DIR"])
    timeline = Timeline(cache)
    tc = timeline.phase("import tinygrad_caps", lambda: __import__("tinygrad_caps"))
    cupy = timeline.phase("import CuPy, make the CUDA context and a first array",
                          lambda: (__import__("cupy"), __import__("cupy").zeros(1))[0])
    from _steps import MODELS, model_batch, seeded_capsnet, training_step
    from tinygrad_caps.cuda_graphs import CapturedStep
    from tinygrad_caps.kernels import gemm, tune, warm_up

    device = tc.backend.normalize_device(args.device)
    cupy.cuda.Device(tc.backend.cuda_index(device)).use()
    timeline.phase("seed: CuPy's cuRAND generator (tc.manual_seed)", lambda: tc.manual_seed(0))

    def cublas():
        gemm.workspace(cupy)
        if getattr(cupy.cuda, "standin_cublas", None) is None:
            gemm._Cublas.for_current_device()

    timeline.phase("cuBLAS: library, handle and workspace", cublas)
    done = timeline.phase("our kernel modules, float32 (NVRTC or CuPy's disk cache, in parallel)",
                          lambda: warm_up(device, dtypes=["float32"]))
    timeline.phases[-1]["module_seconds"] = {k: round(v, 4) for k, v in done.module_seconds.items()}
    timeline.phases[-1]["workers"] = done.workers
    options = MODELS[args.model]
    model = timeline.phase("the model, seeded, to the GPU", lambda: seeded_capsnet(device, **options))
    x, y = model_batch(args.batch, options)
    xt, yt = tc.tensor(x, device=device), tc.tensor(y, device=device)
    _, step = training_step(model, xt, yt.data, capturable=True)
    runner = CapturedStep(step, (xt, yt), warmup=2)
    arrays = [xt.data, yt.data]
    tuner = TimedTuner()
    with tune.using_tuner(tuner):
        timeline.phase("step 1, eager: CuPy's own kernels compile, kernels with variants are measured",
                       lambda: runner(*arrays))
        timeline.phases[-1]["tuning_seconds"] = dict(tuner.seconds)
        timeline.phase("step 2, eager", lambda: runner(*arrays))
        timeline.phase("step 3: the capture and its first replay", lambda: runner(*arrays))
        timeline.phase(f"{args.replays} replays", lambda: [runner(*arrays) for _ in range(args.replays)])
    runner.close()
    replay = timeline.phases[-1]["seconds"] / max(args.replays, 1)
    return {"phases": timeline.phases, "seconds_to_first_replay": timeline.phases[-2]["start_s"]
            + timeline.phases[-2]["seconds"], "replay_seconds": replay,
            "cache_files": len(os.listdir(cache)) if cache.is_dir() else 0}


def run(name: str, scratch: Path, args) -> dict:
    """A run in a new process: ``cold`` with empty caches under ``scratch``, ``warm`` with those left."""
    env = dict(os.environ, CUPY_CACHE_DIR=str(scratch / "kernel_cache"), TINYGRAD_CAPS_TUNE_DIR=str(scratch / "tune"),
               TINYGRAD_CAPS_KERNEL_TUNING=os.environ.get("TINYGRAD_CAPS_KERNEL_TUNING", "on"))
    command = [sys.executable, os.path.abspath(__file__), "--child", "--device", args.device, "--batch",
               str(args.batch), "--model", args.model, "--replays", str(args.replays)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"cold_start.py: the {name} run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(result, run=name, process_seconds=round(wall, 3))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--model", choices=["full", "reduced", "tiny"], default="full")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    if "warm" in args.runs and "cold" not in args.runs:
        parser.error("the warm run reuses the caches of the cold run: ask for both")
    import tinygrad_caps as tc

    if not tc.gpu_available():
        print(f"cold_start.py needs a GPU: {tc.backend._gpu_status()[1]}", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="cold-start-"))
    try:
        rows = [run(name, scratch, args) for name in sorted(args.runs, key=RUNS.index)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps({"device": args.device, "batch": args.batch, "model": args.model, "runs": rows}, indent=2))
        return 0
    for row in rows:
        print(f"{row['run']}: process {row['process_seconds']:.2f} s, first replay after "
              f"{row['seconds_to_first_replay']:.2f} s, then {row['replay_seconds'] * 1e3:.2f} ms per step; "
              f"{row['cache_files']} kernel cache files")
        for phase in row["phases"]:
            files = phase["new_cache_files"]
            print(f"  {phase['start_s']:8.3f} s  {phase['seconds']:8.3f} s  {phase['phase']}"
                  + (f"  (+{files['ours']} ours, +{files['cupy']} CuPy's cache files)" if sum(files.values()) else ""))
            for module, seconds in sorted(phase.get("module_seconds", {}).items(), key=lambda kv: -kv[1]):
                print(f"{'':24}{seconds:8.3f} s  {module}")
            for kernel, seconds in phase.get("tuning_seconds", {}).items():
                print(f"{'':24}{seconds:8.3f} s  tuning {kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
