"""Time CapsNet's DigitCaps: the prediction u_hat = W u plus r dynamic-routing iterations,
forward and forward+backward (gradients of W and u), for every implementation on this machine:

    numpy   the engine on the CPU
    cupy    the engine on the GPU with plain CuPy ops (kernels.use_raw_kernels(False))
    raw     the engine on the GPU with our RawKernels
    torch   the same math in PyTorch eager, on the CPU and (when present) on CUDA

All implementations are first checked against a float64 NumPy reference. GPU timings use CUDA
events. For each pass the table gives the median and spread, peak device memory, the bytes the
pass must move at least (u_hat is B*I*J*D values, read or written once per contraction), and the
fraction of the memory bandwidth that a device-to-device copy reaches in this same run.

    python benchmarks/routing_speed.py [--batch 100] [--in-caps 1152] [--out-caps 10] [--dim 16]
        [--in-dim 8] [--iterations 3] [--repeat 20] [--impl numpy cupy raw torch] [--json]
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
            return engine_routing(self.u, self.w, self.iterations)

    def forward_backward(self):
        self.u.grad = self.w.grad = None
        v = engine_routing(self.u, self.w, self.iterations)
        v.backward(self.g)
        return v

    def results(self):
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
def gpu_sync(name):
    if name in ("cupy", "raw"):
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
        if name in ("cupy", "raw"):
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
    """Peak device bytes of one call (None on the CPU)."""
    if impl.name in ("cupy", "raw"):
        import cupy

        pool = cupy.get_default_memory_pool()
        fn()
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()
        before = pool.total_bytes()
        fn()
        cupy.cuda.Device().synchronize()
        return pool.total_bytes() - before
    if impl.name == "torch-cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    return None


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


def contraction_kernels(args, bandwidth, repeat):
    """Each raw contraction alone on the GPU: seconds, bytes moved, fraction of copy bandwidth."""
    import cupy

    from tinygrad_caps.kernels import capsule, routing

    u, w, _ = make_inputs(args)
    b, i, j, d = args.batch, args.in_caps, args.out_caps, args.dim
    u, w = cupy.asarray(u), cupy.asarray(w)
    u_hat = capsule.capsule_predict(u, w)
    c = cupy.full((b, i, j), 1.0 / j, cupy.float32)
    v = cupy.ones((b, j, d), cupy.float32)
    cases = {
        "capsule_predict": (lambda: capsule.capsule_predict(u, w), u.nbytes + w.nbytes + u_hat.nbytes),
        "capsule_grad_u": (lambda: capsule.capsule_grad_u(u_hat, w), u_hat.nbytes + w.nbytes + u.nbytes),
        "capsule_grad_w": (lambda: capsule.capsule_grad_w(u_hat, u), u_hat.nbytes + u.nbytes + w.nbytes),
        "routing_weighted_sum": (lambda: routing.routing_weighted_sum(c, u_hat), u_hat.nbytes + c.nbytes + v.nbytes),
        "routing_agreement": (lambda: routing.routing_agreement(u_hat, v), u_hat.nbytes + v.nbytes + c.nbytes),
    }
    out = {}
    for name, (fn, nbytes) in cases.items():
        samples = time_pass("raw", fn, repeat, 3)
        seconds = statistics.median(samples)
        out[name] = {"seconds": seconds, "bytes": nbytes, "fraction_of_copy_bandwidth": nbytes / seconds / bandwidth}
    return out


def implementations(args, arrays):
    wanted = set(args.impl)
    found = []
    if "numpy" in wanted:
        found.append(EngineImpl("numpy", "cpu", True, args, arrays))
    if tc.gpu_available():
        if "cupy" in wanted:
            found.append(EngineImpl("cupy", "cuda", False, args, arrays))
        if "raw" in wanted:
            found.append(EngineImpl("raw", "cuda", True, args, arrays))
    if torch is not None and "torch" in wanted:
        found.append(TorchImpl("torch-cpu", "cpu", args, arrays))
        if torch.cuda.is_available():
            found.append(TorchImpl("torch-cuda", "cuda", args, arrays))
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
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--in-caps", type=int, default=1152)
    parser.add_argument("--out-caps", type=int, default=10)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--in-dim", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--impl", nargs="+", default=["numpy", "cupy", "raw", "torch"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

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

        info["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []
    for impl in impls:
        device = "cuda" if impl.device == "cuda" else "cpu"
        with impl:
            for pass_name, fn in (("forward", impl.forward), ("forward+backward", impl.forward_backward)):
                samples = time_pass(impl.name, fn, args.repeat, args.warmup)
                median = statistics.median(samples)
                nbytes = minimum_bytes(args, 4, pass_name != "forward")
                rows.append({"impl": impl.name, "pass": pass_name, "median_s": median,
                             "spread_s": [min(samples), max(samples)], "peak_bytes": peak_memory(impl, fn),
                             "min_bytes": nbytes, "fraction_of_copy_bandwidth": nbytes / median / bandwidth[device],
                             "max_rel_error": agreement[impl.name]})
    result = {"info": info, "copy_bandwidth_bytes_per_s": bandwidth, "rows": rows}
    if tc.gpu_available() and "raw" in args.impl:
        result["raw_contractions"] = contraction_kernels(args, bandwidth["cuda"], args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"# {info}")
    print("# copy bandwidth: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bandwidth.items()))
    print(f"{'impl':<11} {'pass':<17} {'median':>10} {'min..max':>21} {'peak MiB':>9} {'min MB':>7} {'of copy BW':>10} {'rel err':>8}")
    for r in rows:
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2 ** 20:.0f}"
        lo, hi = r["spread_s"]
        print(f"{r['impl']:<11} {r['pass']:<17} {r['median_s'] * 1e3:>8.2f}ms {lo * 1e3:>9.2f}..{hi * 1e3:>8.2f}ms "
              f"{peak:>9} {r['min_bytes'] / 1e6:>7.0f} {r['fraction_of_copy_bandwidth']:>9.1%} {r['max_rel_error']:>8.1e}")
    by = {(r["impl"], r["pass"]): r["median_s"] for r in rows}
    for pass_name in ("forward", "forward+backward"):
        for a, b in (("raw", "cupy"), ("raw", "torch-cuda"), ("numpy", "torch-cpu")):
            if (a, pass_name) in by and (b, pass_name) in by:
                print(f"ratio {a}/{b} {pass_name}: {by[(a, pass_name)] / by[(b, pass_name)]:.2f}")
    for name, k in result.get("raw_contractions", {}).items():
        print(f"kernel {name:<22} {k['seconds'] * 1e6:8.1f} us  {k['bytes'] / 1e6:7.1f} MB  "
              f"{k['fraction_of_copy_bandwidth']:.0%} of copy bandwidth")


if __name__ == "__main__":
    main()
