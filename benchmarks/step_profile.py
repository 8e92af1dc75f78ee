"""Where a training step's GPU time goes, op by op: each op the tape records (every forward, every
node's backward, the gradient sums, Adam's update) of one profiling step, timed on the GPU between two
CUDA events, with its FLOPs and least bytes against the GPU's datasheet peak (FP32 at "highest", TF32
at "high") and the copy bandwidth measured in the same run; beside them the captured step's own GPU
time (CUDA events around a replay), so that the ops' sum can be read against what the graph takes.

How an op's GPU time is taken apart from the host's: before each op the profiling step queues a
kernel that spins on the GPU for ``--spin-us`` (default 2000 us), then the op's start event; while
the GPU spins, the host queues the op's launches and its stop event, so the events bracket the op's
kernels run back to back, as in the graph, without the host's time between them. An op that waits
for the host inside (a value read back) shows its host time too and is marked "host" (its host time
exceeded the spin). ``--spin-us 0`` times ops without the spin (the CPU stand-in's smoke test).

FLOPs: 2 per multiply-add of a contraction (the matrix products, the convolutions, the capsule
prediction, the routing's weighted sums and agreements; a backward counts 2 per gradient it returns),
1 per value of everything else. Bytes: what the op reads and writes at least (its inputs and outputs
once; a backward its upstream gradient, its inputs and the gradients it returns). Per op: its time,
share of the step, GFLOP and MB, TFLOP/s and GB/s with their fractions of the peak and the copy
bandwidth, and the fraction of its own bound (max(FLOPs / peak, bytes / bandwidth) over its time).

    python benchmarks/step_profile.py [--device cuda] [--batch 100] [--precision highest high]
                                      [--model full|reduced|tiny] [--spin-us 2000] [--top 25] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict

import numpy as np

import tinygrad_caps as tc
from _steps import MODELS, model_batch, seeded_capsnet, training_step

SPIN_SOURCE = r"""
extern "C" __global__ void spin_cycles(long long cycles)
{
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""
CONTRACTIONS = ("MatMul", "Conv2d", "CapsulePredict", "RoutingWeightedSum", "RoutingAgreement")


def contraction_flops(name: str, shapes: list) -> int | None:
    """FLOPs of a contraction op's forward from its inputs' shapes (and output's, last); None for others."""
    prod = math.prod
    if name == "MatMul" and len(shapes) >= 2:
        a, b = shapes[0], shapes[1]
        batch = prod(a[:-2]) if len(a) > 2 else (prod(b[:-2]) if len(b) > 2 else 1)
        return 2 * batch * (a[-2] if len(a) > 1 else 1) * a[-1] * (b[-1] if len(b) > 1 else 1)
    if name == "Conv2d" and len(shapes) >= 2:
        weight, out = shapes[1], shapes[-1]
        return 2 * out[0] * out[2] * out[3] * weight[0] * weight[1] * weight[2] * weight[3]
    if name == "CapsulePredict" and len(shapes) >= 2:
        (b, i, k), (_, j, d, _) = shapes[0], shapes[1]
        return 2 * b * i * j * d * k
    if name == "RoutingWeightedSum" and len(shapes) >= 2:
        return 2 * prod(shapes[1])
    if name == "RoutingAgreement" and shapes:
        return 2 * prod(shapes[0])
    return None


def nbytes(arrays) -> int:
    return int(sum(getattr(a, "nbytes", 0) for a in arrays if a is not None))


def data_of(tensors):
    return [getattr(t, "data", None) for t in tensors if t is not None]


def tensor_bytes(tensors) -> int:
    """Bytes of tensors from their shapes and dtypes (a node's unsaved inputs tell only those)."""
    return int(sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in tensors if t is not None))


def sm_clock_khz(cupy) -> float:
    """The SM clock in kHz: cudaDeviceProp.clockRate (gone from CUDA 13's struct), else the device
    attribute cudaDevAttrClockRate (13), else 2.5 GHz (above any GPU's: the spin then lasts at least
    as long as asked, which is all it must)."""
    device = cupy.cuda.Device().id
    rate = cupy.cuda.runtime.getDeviceProperties(device).get("clockRate")
    if not rate:
        try:
            rate = cupy.cuda.runtime.deviceGetAttribute(13, device)
        except Exception:  # noqa: BLE001  (an attribute this runtime does not know: the upper bound)
            rate = None
    return float(rate or 2.5e6)


class GpuOpTimer:
    """A tape observer that brackets every op with CUDA events (after a spin kernel): see the module
    docstring. ``entries``: (name, phase, start event, stop event, flops, bytes, host seconds)."""

    sees_backward_ops = False
    reads_gradients = False

    def __init__(self, spin_us: float):
        import cupy

        self.cupy, self.entries = cupy, []
        self.spin = None
        if spin_us > 0:
            self.spin_cycles = np.int64(spin_us * sm_clock_khz(cupy) / 1e3)
            self.spin = cupy.RawKernel(SPIN_SOURCE, "spin_cycles")
        self.spin_s = spin_us / 1e6

    def clock(self, arrays=()):
        if self.spin is not None:
            self.spin((1,), (1,), (self.spin_cycles,))
        start = self.cupy.cuda.Event()
        start.record()
        return start, time.perf_counter()

    def _stop(self, name, phase, start, flops, moved):
        stop = self.cupy.cuda.Event()
        stop.record()
        self.entries.append((name, phase, start[0], stop, flops, moved, time.perf_counter() - start[1]))

    def forward_recorded(self, fn, inputs, output, start):
        shapes = [tuple(t.shape) for t in inputs] + [tuple(output.shape)]
        flops = contraction_flops(fn.name, shapes)
        self._stop(fn.name, "forward", start, flops if flops is not None else int(output.size),
                   nbytes(data_of(inputs)) + int(output.data.nbytes))

    def node_backward(self, fn, grad_output, grads, start):
        returned = [g for g in grads if g is not None and hasattr(g, "data")]
        inputs = list(getattr(fn, "inputs", ()) or ())
        flops = contraction_flops(fn.name, [tuple(t.shape) for t in inputs] + [tuple(grad_output.shape)])
        flops = flops * len(returned) if flops is not None else int(grad_output.size) * max(1, len(returned))
        self._stop(fn.name, "backward", start, flops,
                   int(grad_output.nbytes) + tensor_bytes(inputs) + nbytes(data_of(returned)))

    def gradient_summed(self, result, start, created):
        data = getattr(result, "data", None)
        size = int(getattr(data, "size", 0))
        self._stop("(gradient sums)", "backward", start, size, 3 * int(getattr(data, "nbytes", 0)))

    def around(self, name, phase, fn, flops, moved):
        """Time ``fn()`` as an entry of its own (the optimizer's update, which the tape does not record)."""
        start = self.clock()
        fn()
        self._stop(name, phase, start, flops, moved)


def profile(args, precision: str) -> dict:
    """One profiling step of ``args.model`` at ``args.batch`` and ``precision``; its table and totals."""
    import cupy

    from _timing import gpu_events
    from gpu_peaks import peak_for
    from routing_speed import copy_bandwidth
    from tinygrad_caps.autograd.observers import observing
    from tinygrad_caps.cuda_graphs import CapturedStep

    device = tc.backend.normalize_device(args.device)
    cupy.cuda.Device(tc.backend.cuda_index(device)).use()
    tc.set_matmul_precision(precision)
    options = MODELS[args.model]
    model = seeded_capsnet(device, **options)
    x, y = model_batch(args.batch, options)
    xt, yt = tc.tensor(x, device=device), tc.tensor(y, device=device)
    optimizer, step = training_step(model, xt, yt.data, capturable=True)
    for _ in range(2):  # compiles, tuning, the optimizer's state: none of it in the profile
        step()
    cupy.cuda.Device().synchronize()
    timer = GpuOpTimer(args.spin_us)
    update = optimizer.step
    parameters = [p.data for p in model.parameters()]
    values = sum(int(p.size) for p in parameters)
    optimizer.step = lambda: timer.around("Adam (every parameter)", "update", update, 10 * values,
                                          7 * nbytes(parameters))
    with observing(timer):
        step()
    optimizer.step = update
    cupy.cuda.Device().synchronize()
    rows = defaultdict(lambda: {"calls": 0, "seconds": 0.0, "flops": 0, "bytes": 0, "host_waits": 0})
    for name, phase, start, stop, flops, moved, host in timer.entries:
        row = rows[(name, phase)]
        row["calls"] += 1
        row["seconds"] += cupy.cuda.get_elapsed_time(start, stop) / 1e3
        row["flops"] += flops
        row["bytes"] += moved
        row["host_waits"] += int(timer.spin is not None and host > timer.spin_s)
    runner = CapturedStep(step, (xt, yt), warmup=1)
    arrays = [xt.data, yt.data]
    for _ in range(3):
        runner(*arrays)
    record_start, record_stop, seconds = gpu_events("cupy")
    replays = []
    for _ in range(5):
        record_start()
        runner(*arrays)
        record_stop()
        replays.append(seconds())
    runner.close()
    tc.set_matmul_precision("highest")
    gpu = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    peak = peak_for(gpu)
    peak_flops = peak.flops(precision) if peak is not None else None
    bandwidth = copy_bandwidth("cuda")
    total = sum(row["seconds"] for row in rows.values())
    table = []
    for (name, phase), row in sorted(rows.items(), key=lambda item: -item[1]["seconds"]):
        s = max(row["seconds"], 1e-12)
        bound = max(row["flops"] / peak_flops if peak_flops else 0.0, row["bytes"] / bandwidth)
        table.append({"op": name, "phase": phase, "calls": row["calls"], "seconds": row["seconds"],
                      "share": row["seconds"] / total if total else None, "gflop": row["flops"] / 1e9,
                      "mb": row["bytes"] / 1e6, "tflops": row["flops"] / s / 1e12,
                      "fraction_of_peak": row["flops"] / s / peak_flops if peak_flops else None,
                      "gb_per_s": row["bytes"] / s / 1e9, "fraction_of_copy_bandwidth": row["bytes"] / s / bandwidth,
                      "fraction_of_bound": bound / s, "host_waits": row["host_waits"]})
    return {"precision": precision, "batch": args.batch, "model": args.model, "gpu": gpu,
            "peak": None if peak is None else peak._asdict(), "copy_bandwidth_bytes_per_s": bandwidth,
            "ops_seconds": total, "captured_step_seconds": float(np.median(replays)),
            "ops": table}


def print_profile(result: dict, top: int) -> None:
    peak = result["peak"]
    kind = {"highest": "FP32", "high": "TF32"}[result["precision"]]
    print(f"{result['gpu']}, {result['model']} model, B={result['batch']}, {result['precision']}: the ops add up to "
          f"{result['ops_seconds'] * 1e3:.2f} ms of GPU time; the captured step takes "
          f"{result['captured_step_seconds'] * 1e3:.2f} ms (CUDA events around a replay); peak "
          f"{(peak or {}).get(kind.lower() + '_flops', 0) / 1e12:.0f} TFLOP/s {kind}, copy bandwidth "
          f"{result['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s")
    print(f"{'op':<26} {'phase':<8} {'calls':>5} {'ms':>8} {'share':>6} {'GFLOP':>8} {'MB':>8} {'TFLOP/s':>8} "
          f"{'of peak':>7} {'GB/s':>7} {'of BW':>6} {'of bound':>8}")
    for row in result["ops"][:top]:
        of_peak = "-" if row["fraction_of_peak"] is None else f"{row['fraction_of_peak']:.1%}"
        print(f"{row['op'][:26]:<26} {row['phase']:<8} {row['calls']:>5} {row['seconds'] * 1e3:8.3f} "
              f"{row['share']:6.1%} {row['gflop']:8.3f} {row['mb']:8.1f} {row['tflops']:8.2f} {of_peak:>7} "
              f"{row['gb_per_s']:7.0f} {row['fraction_of_copy_bandwidth']:6.1%} {row['fraction_of_bound']:8.1%}"
              + ("  host" if row["host_waits"] else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--precision", nargs="+", choices=["highest", "high"], default=["highest", "high"])
    parser.add_argument("--model", choices=sorted(MODELS), default="full")
    parser.add_argument("--spin-us", type=float, default=2000.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.spin_us < 0 or args.batch < 1 or args.top < 1:
        print("step_profile.py: --spin-us must be >= 0, --batch and --top >= 1", file=sys.stderr)
        return 2
    if not tc.gpu_available():
        print(f"step_profile.py needs a GPU: {tc.backend._gpu_status()[1]}", file=sys.stderr)
        return 2
    results = [profile(args, precision) for precision in args.precision]
    if args.json:
        print(json.dumps({"profiles": results}, indent=2))
        return 0
    for result in results:
        print_profile(result, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
