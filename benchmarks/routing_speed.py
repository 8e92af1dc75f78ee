"""Time CapsNet's DigitCaps: the prediction u_hat = W u plus r dynamic-routing iterations,
forward and forward+backward (gradients of W and u), for each implementation:

    numpy   the engine on the CPU
    cupy    the engine on the GPU with plain CuPy ops (kernels.use_raw_kernels(False))
    raw     the engine on the GPU with our RawKernels (forward op by op, as with a gradient)
    fused   forward only: the engine's prediction, then routing_forward (no_grad): S blocks per
            example and one launch per iteration, or one block per example and one launch where
            I is small (routing.choose_forward_slices)
    torch   the same math in PyTorch eager: on CUDA where there is a GPU, else on the CPU

On a GPU machine the default is the GPU implementations only (cupy raw fused torch); without
one, numpy and torch. All are first checked against a float64 NumPy reference. GPU timings use
CUDA events. Per pass: median and spread, the peak of live bytes in CuPy's memory pool (or
PyTorch's allocator), the bytes the pass must move at least (u_hat is B*I*J*D values, read or
written once per contraction), and the fraction of a device-to-device copy's bandwidth measured
in this same run.

On the GPU, every kernel is also timed alone: "kernel" is CUDA-event time of the launch only
(inputs, outputs and the launch record prepared beforehand, many launches back to back), "op" the
launcher call end to end (checks, allocation, launch); the bandwidth fraction is computed from the
kernel time. Beside each kernel, its variant: the one measured fastest on this GPU (kernels/tune.py,
"tuned" now or "cached" from an earlier process), the fixed default ("default", with tuning off),
or the one the row forces ("forced").

    python benchmarks/routing_speed.py [--batch 100] [--in-caps 1152] [--out-caps 10] [--dim 16]
        [--in-dim 8] [--iterations 3] [--repeat 20] [--impl cupy raw fused torch]
        [--forward-slices 4 8 11 16 36] [--json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps import kernels
from tinygrad_caps.models.app.cli.model_options import positive_int
from _timing import say_pytorch_missing

try:
    import torch
except ImportError:
    torch = None


def make_inputs(args, dtype=np.float32):
    rng = np.random.default_rng(0)
    u = rng.standard_normal((args.batch, args.in_caps, args.in_dim)).astype(dtype)
    w = (rng.standard_normal((args.in_caps, args.out_caps, args.dim, args.in_dim)) * 0.05).astype(dtype)
    g = rng.standard_normal((args.batch, args.out_caps, args.dim)).astype(dtype)
    return u, w, g


# ----- the math, once per framework -----
def engine_routing(u, w, iterations):
    u_hat = F.capsule_predict(u, w)
    b = tc.zeros((u.shape[0], w.shape[0], w.shape[1]), dtype=u.dtype, device=u.device)
    for r in range(iterations):
        v = F.squash(F.routing_weighted_sum(F.softmax(b, axis=2), u_hat), axis=-1)
        if r < iterations - 1:
            b = b + F.routing_agreement(u_hat, v)
    return v


def torch_routing(u, w, iterations):
    u_hat = torch.einsum("ijdk,bik->bijd", w, u)
    b = torch.zeros(u.shape[0], w.shape[0], w.shape[1], dtype=u.dtype, device=u.device)
    for r in range(iterations):
        c = torch.softmax(b, dim=2)
        s = torch.einsum("bij,bijd->bjd", c, u_hat)
        sq = (s * s).sum(-1, keepdim=True)
        v = sq / (1 + sq) * s / torch.sqrt(sq + 1e-8)
        if r < iterations - 1:
            b = b + torch.einsum("bijd,bjd->bij", u_hat, v)
    return v


class EngineImpl:
    def __init__(self, name, device, raw, args, arrays):
        self.name, self.device, self.raw, self.iterations = name, device, raw, args.iterations
        u, w, g = arrays
        self.u = tc.tensor(u, device=device, requires_grad=True)
        self.w = tc.tensor(w, device=device, requires_grad=True)
        self.g = tc.tensor(g, device=device)

    def __enter__(self):
        kernels.use_raw_kernels(self.raw)
        return self

    def __exit__(self, *exc):
        kernels.use_raw_kernels(True)

    def forward(self):
        with tc.no_grad():
            if self.name == "fused":
                return F.routing_forward(F.capsule_predict(self.u, self.w), self.iterations)
            return engine_routing(self.u, self.w, self.iterations)

    def forward_backward(self):
        if self.name == "fused":
            return None  # forward only: the gradient of routing is always derived op by op
        self.u.grad = self.w.grad = None
        v = engine_routing(self.u, self.w, self.iterations)
        v.backward(self.g)
        return v

    def results(self):
        if self.name == "fused":
            return (self.forward().numpy(),)
        v = self.forward_backward()
        return v.numpy(), self.u.grad.numpy(), self.w.grad.numpy()


class TorchImpl:
    def __init__(self, name, device, args, arrays):
        self.name, self.device, self.iterations = name, device, args.iterations
        u, w, g = arrays
        self.u = torch.tensor(u, device=device, requires_grad=True)
        self.w = torch.tensor(w, device=device, requires_grad=True)
        self.g = torch.tensor(g, device=device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def forward(self):
        with torch.no_grad():
            return torch_routing(self.u, self.w, self.iterations)

    def forward_backward(self):
        self.u.grad = self.w.grad = None
        v = torch_routing(self.u, self.w, self.iterations)
        v.backward(self.g)
        return v

    def results(self):
        v = self.forward_backward()
        return v.detach().cpu().numpy(), self.u.grad.cpu().numpy(), self.w.grad.cpu().numpy()


# ----- timing and memory -----
GPU_ENGINE_IMPLS = ("cupy", "raw", "fused")

def gpu_sync(name):
    if name in GPU_ENGINE_IMPLS:
        import cupy

        cupy.cuda.Device().synchronize()
    elif name == "torch-cuda":
        torch.cuda.synchronize()


def time_pass(name, fn, repeat, warmup):
    """Seconds per call of implementation ``name``: CUDA events on the GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    gpu_sync(name)
    samples = []
    for _ in range(repeat):
        if name in GPU_ENGINE_IMPLS:
            import cupy

            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        elif name == "torch-cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return samples


def peak_memory(impl, fn):
    """Peak live device bytes during one call, above what was live before it (None on the CPU):
    CuPy's memory pool through a MemoryHook, PyTorch's allocator statistics."""
    if impl.name in GPU_ENGINE_IMPLS:
        import cupy

        fn()  # warm: compile, cache
        cupy.cuda.Device().synchronize()
        hook = PoolPeak()
        with hook:
            fn()
            cupy.cuda.Device().synchronize()
        return hook.peak
    if impl.name == "torch-cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    return None


def PoolPeak():
    """A fresh pool-peak hook (used as a context manager): the engine's ``graph_pool.peak_bytes_hook``."""
    from tinygrad_caps.graph_pool import peak_bytes_hook

    return peak_bytes_hook()


def minimum_bytes(args, itemsize, backward):
    """Bytes a pass must move at least: every contraction reads (or writes) u_hat once."""
    b, i, j, d, k, r = args.batch, args.in_caps, args.out_caps, args.dim, args.in_dim, args.iterations
    u_hat, logits = b * i * j * d, b * i * j
    forward = (b * i * k + i * j * d * k + u_hat) + r * (u_hat + logits) + (r - 1) * (u_hat + logits)
    if not backward:
        return forward * itemsize
    # backward: each weighted sum and agreement reads u_hat and writes a u_hat-sized gradient term,
    # the prediction's two adjoints read the accumulated u_hat gradient twice
    extra = r * (2 * u_hat + logits) + (r - 1) * (2 * u_hat + logits) + 2 * u_hat + i * j * d * k + b * i * k
    return (forward + extra) * itemsize


def copy_bandwidth(device):
    """Bytes/s of a large device-to-device (or host memory) copy: read + write."""
    n = 256 * 2 ** 20 // 4
    if device == "cuda":
        import cupy

        src, dst = cupy.ones(n, cupy.float32), cupy.empty(n, cupy.float32)
        for _ in range(3):
            dst[...] = src
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(10):
            dst[...] = src
        stop.record()
        stop.synchronize()
        return 2 * src.nbytes * 10 / (cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(5):
        np.copyto(dst, src)
    return 2 * src.nbytes * 5 / (time.perf_counter() - t0)


class RecordingRunner:
    """Runs launches on the GPU and keeps their records, to replay the kernels alone."""

    def __init__(self):
        from tinygrad_caps.kernels.launch import run_on_gpu

        self.run, self.records = run_on_gpu, []

    def __call__(self, launch):
        self.records.append(launch)
        self.run(launch)


def kernel_seconds(records, repeat):
    """CUDA-event seconds per replay of ``records`` (back to back, so launch gaps hide behind work)."""
    import cupy

    from tinygrad_caps.kernels.launch import run_on_gpu

    for _ in range(3):
        for record in records:
            run_on_gpu(record)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeat):
        for record in records:
            run_on_gpu(record)
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / 1e3 / repeat


# The kernels' goals, as fractions of the copy bandwidth measured in the same run (kernel time), and
# the fused forward's speed-up over the op-by-op forward (raw); each figure is printed beside its goal.
KERNEL_BANDWIDTH_GOALS = {"capsule_predict": 0.80, "capsule_grad (u and W)": 0.50,
                          "capsule_grad_u": 0.50, "capsule_grad_w": 0.50, "routing_agreement": 0.60,
                          "im2col (PrimaryCaps)": 0.50}
FUSED_FORWARD_SPEEDUP_GOAL = 5.0


def with_goal(name: str, figures: dict) -> dict:
    """``figures`` of the kernel ``name`` with its bandwidth goal and whether it is met (where it has one)."""
    goal = KERNEL_BANDWIDTH_GOALS.get(name)
    if goal is None:
        return figures
    return dict(figures, goal_fraction_of_copy_bandwidth=goal, goal_met=figures["fraction_of_copy_bandwidth"] >= goal)


def fused_forward_speedup(rows) -> dict | None:
    """{"speedup": the op-by-op (raw) forward's median over the fused one's, "goal", "met"} at "highest", or None."""
    by = {r["impl"]: r["median_s"] for r in rows if r["pass"] == "forward" and r["precision"] == "highest"}
    if "raw" not in by or "fused" not in by:
        return None
    speedup = by["raw"] / by["fused"]
    return {"speedup": speedup, "goal": FUSED_FORWARD_SPEEDUP_GOAL, "met": speedup >= FUSED_FORWARD_SPEEDUP_GOAL}


def raw_kernels(args, bandwidth, repeat):
    """Each kernel alone on the GPU: kernel-only and end-to-end op seconds, bytes it must move,
    fraction of copy bandwidth (from the kernel time), at DigitCaps' and PrimaryCaps' sizes."""
    import cupy

    from tinygrad_caps.kernels import activation, capsule, conv, optim, routing

    u, w, _ = make_inputs(args)
    b, i, j, d = args.batch, args.in_caps, args.out_caps, args.dim
    u, w = cupy.asarray(u), cupy.asarray(w)
    u_hat = capsule.capsule_predict(u, w)
    c = cupy.full((b, i, j), 1.0 / j, cupy.float32)
    v = cupy.ones((b, j, d), cupy.float32)
    x = cupy.asarray(np.random.default_rng(1).standard_normal((b, args.primary_channels, 20, 20)), dtype=cupy.float32)
    col = conv.im2col(x, (9, 9), (2, 2), (0, 0), False)
    r = args.iterations
    terms = 2 * r - 1  # u_hat's gradient: one product per weighted sum and per agreement
    p, q = cupy.stack([c] * terms), cupy.stack([v] * terms)
    primary = cupy.asarray(np.random.default_rng(2).standard_normal((b, i, u.shape[2])), dtype=cupy.float32)
    trained_w = w.copy()  # updated in place by every adam_step replay
    adam_state = [w * 0.1, w * 0.01, cupy.abs(w) * 1e-3]  # its gradient, exp_avg, exp_avg_sq
    step_count, rate = cupy.zeros(1, dtype=cupy.int32), cupy.full(1, 1e-3, dtype=cupy.float64)  # capturable Adam's
    sms = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"]
    chosen = routing.choose_forward_slices(u_hat.shape, u_hat.dtype, sms)
    slices_label = "one block, one launch" if chosen == routing.SINGLE_BLOCK else f"{chosen} slices"
    predict_bytes, grad_bytes = u.nbytes + w.nbytes + u_hat.nbytes, u_hat.nbytes + 2 * (u.nbytes + w.nbytes)
    # the sliced forward reads u_hat once per iteration (one launch each), the logits r - 2 times,
    # and writes them r - 1 times and c once (the least any variant moves); the one-block kernel
    # reads u_hat 2r - 1 times
    forward_bytes = r * u_hat.nbytes + (2 * r - 2) * c.nbytes + v.nbytes
    im2col_bytes = x.nbytes + col.nbytes
    # each kernel with variants (kernels/tune.py) as the engine runs it (its variant measured fastest
    # on this GPU, or the fixed default), then each of its variants forced
    cases = {
        "capsule_predict": (lambda run: capsule.capsule_predict(u, w, run), predict_bytes),
        "capsule_predict (registers, forced)": (lambda run: capsule.capsule_predict(u, w, run, registers=True),
                                                predict_bytes),
        "capsule_predict (W[i] in shared memory, forced)": (
            lambda run: capsule.capsule_predict(u, w, run, registers=False), predict_bytes),
        "capsule_grad (u and W)": (lambda run: capsule.capsule_grad(u_hat, u, w, run), grad_bytes),
        "capsule_grad (u and W, one pass in registers, forced)": (
            lambda run: capsule.capsule_grad(u_hat, u, w, run, registers=True), grad_bytes),
        "capsule_grad (u and W, one pass, W[i] in shared memory, forced)": (
            lambda run: capsule.capsule_grad(u_hat, u, w, run, registers=False), grad_bytes),
        "capsule_grad_u": (lambda run: capsule.capsule_grad_u(u_hat, w, run), u_hat.nbytes + w.nbytes + u.nbytes),
        "capsule_grad_w": (lambda run: capsule.capsule_grad_w(u_hat, u, run), u_hat.nbytes + u.nbytes + w.nbytes),
        "routing_weighted_sum": (lambda run: routing.routing_weighted_sum(c, u_hat, run),
                                 u_hat.nbytes + c.nbytes + v.nbytes),
        "routing_agreement": (lambda run: routing.routing_agreement(u_hat, v, run), u_hat.nbytes + v.nbytes + c.nbytes),
        f"routing_forward ({r} iterations)": (lambda run: routing.routing_forward(u_hat, r, runner=run), forward_bytes),
        f"routing_forward ({r} iterations, the heuristic's {slices_label} per example, forced)": (
            lambda run: routing.routing_forward(u_hat, r, runner=run, sm_count=sms), forward_bytes),
        f"routing_forward ({r} iterations, one block per example, forced)": (
            lambda run: routing.routing_forward(u_hat, r, runner=run, slices=routing.SINGLE_BLOCK),
            (2 * r - 1) * u_hat.nbytes + 3 * c.nbytes + v.nbytes),
        f"routing_outer_products ({terms} terms)": (lambda run: routing.routing_outer_products(p, q, run),
                                                    u_hat.nbytes + p.nbytes + q.nbytes),
        "squash_rows (PrimaryCaps' capsules)": (lambda run: activation.squash_rows(primary, runner=run), 2 * primary.nbytes),
        "squash_rows_grad (PrimaryCaps' capsules)": (lambda run: activation.squash_rows_grad(primary, primary, runner=run),
                                                     3 * primary.nbytes),
        "softmax_rows (coupling)": (lambda run: activation.softmax_rows(c, runner=run), 2 * c.nbytes),
        "softmax_rows_grad (coupling)": (lambda run: activation.softmax_rows_grad(c, c, runner=run), 3 * c.nbytes),
        "adam_step (W, in place)": (lambda run: optim.adam_step(trained_w, *adam_state, None, 1, 1e-3, (0.9, 0.999), 1e-8,
                                                                runner=run), 7 * w.nbytes),
        "adam_step_capturable (W, in place)": (
            lambda run: optim.adam_step_capturable(trained_w, *adam_state, None, step_count, rate, (0.9, 0.999), 1e-8,
                                                   runner=run), 7 * w.nbytes),
        "im2col (PrimaryCaps)": (lambda run: conv.im2col(x, (9, 9), (2, 2), (0, 0), False, run), im2col_bytes),
        "im2col (PrimaryCaps, im2col_planes: staged image planes, forced)": (
            lambda run: conv.im2col(x, (9, 9), (2, 2), (0, 0), False, run, by_rows=True, planes=True), im2col_bytes),
        "im2col (PrimaryCaps, im2col_rows: one grid row per column row, forced)": (
            lambda run: conv.im2col(x, (9, 9), (2, 2), (0, 0), False, run, planes=False), im2col_bytes),
        "im2col, one element per thread (PrimaryCaps, forced)": (
            lambda run: conv.im2col(x, (9, 9), (2, 2), (0, 0), False, run, by_rows=False), im2col_bytes),
        "col2im (PrimaryCaps)": (lambda run: conv.col2im(col, x.shape, (9, 9), (2, 2), (0, 0), False, run),
                                 im2col_bytes),
    }
    for forced in getattr(args, "forward_slices", None) or ():  # a sweep over S, to tune the heuristic
        cases[f"routing_forward ({r} iterations, {forced} slices per example, forced)"] = (
            lambda run, forced=forced: routing.routing_forward(u_hat, r, runner=run, slices=forced),
            r * u_hat.nbytes + (2 * r - 2) * c.nbytes + v.nbytes)
    from tinygrad_caps.kernels import tune

    out = {}
    for name, (call, nbytes) in cases.items():
        with tune.recording() as choices:
            call(None)  # the GPU runner: a kernel with variants measures them here (or finds its choice)
        recorder = RecordingRunner()
        call(recorder)
        kernel = kernel_seconds(recorder.records, repeat)
        op = statistics.median(time_pass("raw", lambda: call(None), repeat, 3))
        out[name] = with_goal(name, {"kernel_seconds": kernel, "op_seconds": op, "bytes": nbytes,
                                     "launches": len(recorder.records),
                                     "fraction_of_copy_bandwidth": nbytes / kernel / bandwidth,
                                     **variant_of(choices, name)})
    return out


def variant_of(choices, case: str) -> dict:
    """{"variant", "variant_how", "variant_seconds"} of the kernel a case ran, from its tune.Choice
    records (none: the case forces its variant, or the kernel has only one)."""
    if not choices:
        forced = "forced" in case
        return {"variant": "forced" if forced else "-", "variant_how": "forced by the case" if forced else "one variant"}
    choice = choices[-1]
    return {"variant": choice.variant, "variant_how": choice.how + (f" ({choice.reason})" if choice.reason else ""),
            "variant_seconds": choice.seconds}


def implementations(args, arrays):
    """The implementations asked for; GPU ones need a GPU (asking for them without one is an error)."""
    wanted = set(args.impl)
    gpu_wanted = wanted & {"cupy", "raw", "fused"}
    if gpu_wanted and not tc.gpu_available():
        raise SystemExit(f"--impl {' '.join(sorted(gpu_wanted))} needs a GPU, and none is usable here")
    found = []
    if "numpy" in wanted:
        found.append(EngineImpl("numpy", "cpu", True, args, arrays))
    for name, raw in (("cupy", False), ("raw", True), ("fused", True)):
        if name in wanted:
            found.append(EngineImpl(name, "cuda", raw, args, arrays))
    if "torch" in wanted:
        if torch is None:
            raise SystemExit("--impl torch: PyTorch is not installed")
        on_gpu = tc.gpu_available() and torch.cuda.is_available()
        found.append(TorchImpl("torch-cuda" if on_gpu else "torch-cpu", "cuda" if on_gpu else "cpu", args, arrays))
    return found


def check_agreement(impls, args):
    """Every implementation's v and gradients against a float64 NumPy reference."""
    ref_impl = EngineImpl("numpy", "cpu", True, args, make_inputs(args, np.float64))
    reference = ref_impl.results()
    report = {}
    for impl in impls:
        with impl:
            got = impl.results()
        errors = [float(np.abs(a - r).max() / (np.abs(r).max() + 1e-30)) for a, r in zip(got, reference)]
        report[impl.name] = max(errors)
        if max(errors) > 1e-3:
            raise SystemExit(f"{impl.name} disagrees with the float64 reference: relative errors {errors}")
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=positive_int, default=100)
    parser.add_argument("--in-caps", type=positive_int, default=1152)
    parser.add_argument("--out-caps", type=positive_int, default=10)
    parser.add_argument("--dim", type=positive_int, default=16)
    parser.add_argument("--in-dim", type=positive_int, default=8)
    parser.add_argument("--iterations", type=positive_int, default=3)
    parser.add_argument("--primary-channels", type=positive_int, default=256,
                        help="channels into PrimaryCaps' 9x9 convolution (20x20 each) for the im2col and col2im "
                             "kernels (default: CapsNet's 256)")
    parser.add_argument("--repeat", type=positive_int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--impl", nargs="+", choices=["numpy", "cupy", "raw", "fused", "torch"], default=None,
                        help="default: cupy raw fused torch with a GPU, numpy torch without")
    parser.add_argument("--forward-slices", type=int, nargs="*", default=[],
                        help="also time routing_forward alone with each of these slices per example")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.impl is None:
        args.impl = ["cupy", "raw", "fused", "torch"] if tc.gpu_available() else ["numpy", "torch"]
        if torch is None:
            args.impl.remove("torch")
            say_pytorch_missing(args.json)

    arrays = make_inputs(args)
    impls = implementations(args, arrays)
    agreement = check_agreement(impls, args)
    bandwidth = {"cpu": copy_bandwidth("cpu")}
    if tc.gpu_available():
        bandwidth["cuda"] = copy_bandwidth("cuda")
    info = {"machine": platform.processor() or platform.machine(), "numpy": np.__version__,
            "torch": getattr(torch, "__version__", None), "sizes": vars(args).copy()}
    if tc.gpu_available():
        import cupy

        info["gpu"] = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    rows = []
    # Our routing kernels compute in float32 whatever the matmul precision; PyTorch's einsums use
    # cuBLAS, which TF32 speeds up: its rows come at both precisions, side by side.
    runs = [(impl, "highest") for impl in impls] + [(impl, "high") for impl in impls if impl.name == "torch-cuda"]
    for impl, precision in runs:
        device = "cuda" if impl.device == "cuda" else "cpu"
        passes = [("forward", impl.forward)] + ([] if impl.name == "fused" else [("forward+backward", impl.forward_backward)])
        if torch is not None:
            torch.backends.cuda.matmul.allow_tf32 = precision == "high"
        with impl:
            for pass_name, fn in passes:
                samples = time_pass(impl.name, fn, args.repeat, args.warmup)
                median = statistics.median(samples)
                nbytes = minimum_bytes(args, 4, pass_name != "forward")
                rows.append({"impl": impl.name, "precision": precision, "pass": pass_name, "median_s": median,
                             "spread_s": [min(samples), max(samples)], "peak_bytes": peak_memory(impl, fn),
                             "min_bytes": nbytes, "fraction_of_copy_bandwidth": nbytes / median / bandwidth[device],
                             "max_rel_error": agreement[impl.name]})
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    result = {"info": info, "copy_bandwidth_bytes_per_s": bandwidth, "rows": rows}
    speedup = fused_forward_speedup(rows)
    if speedup is not None:
        result["fused_forward_speedup"] = speedup
    if tc.gpu_available() and "raw" in args.impl:
        result["raw_kernels"] = raw_kernels(args, bandwidth["cuda"], args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"# {info}")
    print("# copy bandwidth: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bandwidth.items()))
    print(f"{'impl':<11} {'precision':<9} {'pass':<17} {'median':>10} {'min..max':>21} {'peak MiB':>9} {'min MB':>7} "
          f"{'of copy BW':>10} {'rel err':>8}")
    for r in rows:
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2 ** 20:.0f}"
        lo, hi = r["spread_s"]
        print(f"{r['impl']:<11} {r['precision']:<9} {r['pass']:<17} {r['median_s'] * 1e3:>8.2f}ms {lo * 1e3:>9.2f}.."
              f"{hi * 1e3:>8.2f}ms {peak:>9} {r['min_bytes'] / 1e6:>7.0f} {r['fraction_of_copy_bandwidth']:>9.1%} "
              f"{r['max_rel_error']:>8.1e}")
    by = {(r["impl"], r["pass"]): r["median_s"] for r in rows if r["precision"] == "highest"}
    for pass_name in ("forward", "forward+backward"):
        for a, b in (("raw", "cupy"), ("raw", "torch-cuda"), ("fused", "raw"), ("numpy", "torch-cpu")):
            if (a, pass_name) in by and (b, pass_name) in by:
                print(f"ratio {a}/{b} {pass_name}: {by[(a, pass_name)] / by[(b, pass_name)]:.2f}")
    speedup = result.get("fused_forward_speedup")
    if speedup:
        print(f"fused forward: {speedup['speedup']:.2f}x the op-by-op forward (goal >= {speedup['goal']:g}x: "
              f"{'met' if speedup['met'] else 'NOT met'})")
    for name, k in result.get("raw_kernels", {}).items():
        goal = (f"  goal >= {k['goal_fraction_of_copy_bandwidth']:.0%}: {'met' if k['goal_met'] else 'NOT met'}"
                if "goal_met" in k else "")
        print(f"kernel {name:<34} kernel {k['kernel_seconds'] * 1e6:8.1f} us  op {k['op_seconds'] * 1e6:8.1f} us  "
              f"{k['bytes'] / 1e6:7.1f} MB  {k['fraction_of_copy_bandwidth']:.0%} of copy bandwidth{goal}  "
              f"variant {k['variant']} ({k['variant_how']})")


if __name__ == "__main__":
    main()
