"""Do the CUDA graphs of one process read or write only memory they own? The check behind the crash of
the H200 run of 2026-11-28 (train_step.py: PyTorch's captured step hit a device-side assert, "index
out of bounds" in a scatter, in a process where our step had been captured and replayed).

In one process, as train_step.py does: our CapsNet step captured as a CUDA graph (tc.cuda_graphs) and
PyTorch's whole step captured (``_torch_variants.build_graph``), each beside an eager twin started from
the same weights. Then, ``--steps`` times: both libraries allocate and free arrays of many sizes filled
with values no label or weight takes (1e9, -7, NaN), and empty their caches (CuPy's default pool,
PyTorch's ``empty_cache``); each graph is replayed and each twin steps. At the end each graph's
weights must equal its twin's and each graph's static labels must be unchanged: a graph that read or
wrote memory it had given up (or that someone else owned) shows as a difference, a NaN or a device
assert. Under ``compute-sanitizer --tool memcheck`` with ``--no-cupy-pool`` (every CuPy array outside
a graph's pool then comes straight from cudaMalloc and goes back with cudaFree), a graph that touches
freed memory is also an invalid access.

Then, in a process of its own (a device assert poisons a process), the first version of PyTorch's graph
recipe is rebuilt (``--reproduce``): its static inputs and optimizer let go when the builder returns,
as before the fix; after a few eager PyTorch steps, the memory that held the static labels is read
(what the replay's ``one_hot`` scatters with), then the graph is replayed. The JSON says what that
memory held and how the replay ended.

    python benchmarks/graph_buffers_check.py [--batch 32] [--steps 5] [--precision highest]
        [--model full|reduced|tiny] [--without-torch] [--no-cupy-pool] [--no-reproduce] [--json]
    compute-sanitizer --tool memcheck --error-exitcode 9 python benchmarks/graph_buffers_check.py \\
        --steps 2 --no-cupy-pool --no-reproduce

Exits 1 where a graph's weights or labels differ from its twin's; 2 without a GPU. (``--model tiny``
runs on the CPU stand-in for CuPy, for the smoke test; PyTorch then is left out.)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

import numpy as np

import tinygrad_caps as tc
from _steps import MODELS, model_batch, seeded_capsnet, training_step

SENTINELS = {"int64": 10 ** 9, "float32": float("nan"), "negative": -7}
CHURN_SIZES = (32, 100, 4096, 1 << 16, 1 << 20, 1 << 24)  # elements: the labels' sizes and far beyond


def our_pair(args, device):
    """(captured step, its model, its static labels, eager twin step, twin model): our CapsNet step
    captured after two eager warm-up steps (and launched once), and an eager twin three steps in."""
    from tinygrad_caps.cuda_graphs import CapturedStep

    options = MODELS[args.model]
    x, y = model_batch(args.batch, options)
    models = []
    for captured in (True, False):
        model = seeded_capsnet(device, **options)
        xt, yt = tc.tensor(x, device=device), tc.tensor(y, device=device)
        _, step = training_step(model, xt, yt.data, capturable=True)
        if captured:
            runner = CapturedStep(step, (xt, yt), warmup=2)
            arrays = [xt.data, yt.data]
            replay = lambda runner=runner, arrays=arrays: runner(*arrays)  # noqa: E731
            for _ in range(3):
                replay()
            models.append((replay, model, yt, runner))
        else:
            for _ in range(3):
                step()
            models.append((step, model, yt, None))
    return models


def torch_pair(args, torch_device):
    """(graph step, its TorchStep, eager twin step, twin TorchStep): PyTorch's captured step
    (build_graph: three warm-up steps) and an eager twin brought to the same three steps."""
    from _torch_variants import build_eager, build_graph
    from train_step import seeded_state, torch_batch, torch_model

    state = seeded_state()
    graph = build_graph(torch_model(state, torch_device), *torch_batch(args.batch, torch_device))
    eager = build_eager(torch_model(state, torch_device), *torch_batch(args.batch, torch_device))
    for _ in range(2):
        eager.step()
    return graph, eager


def churn(torch_device, use_torch: bool) -> None:
    """Allocate and free arrays of CHURN_SIZES in both libraries, filled with SENTINELS, then empty
    both caches: memory a graph gave up is then someone else's, with values no graph expects."""
    import cupy

    for n in CHURN_SIZES:
        for dtype, value in ((cupy.int64, SENTINELS["int64"]), (cupy.int64, SENTINELS["negative"]),
                             (cupy.float32, SENTINELS["float32"])):
            a = cupy.full(n, value, dtype=dtype)
            del a
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    if use_torch:
        import torch

        kept = []
        for n in CHURN_SIZES:
            kept.append(torch.full((n,), SENTINELS["int64"], dtype=torch.int64, device=torch_device))
            kept.append(torch.full((n,), float("nan"), device=torch_device))
        del kept
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def largest_relative_difference(a: dict, b: dict) -> float:
    """The largest |a - b| / max |a| over the arrays of two {name: NumPy array} (NaN compares as inf)."""
    worst = 0.0
    for name, x in a.items():
        y = b[name]
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            return float("inf")
        worst = max(worst, float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-30)))
    return worst


def check(args) -> dict:
    """Both libraries' graphs against their twins, with the churn between replays (see the docstring)."""
    import cupy

    from train_step import set_precision

    device = tc.backend.normalize_device(args.device)
    cupy.cuda.Device(tc.backend.cuda_index(device)).use()
    use_torch = not args.without_torch
    torch_device = f"cuda:{tc.backend.cuda_index(device)}"
    set_precision(args.precision)
    (replay, model, labels, runner), (eager, twin, _, _) = our_pair(args, device)
    labels_before = tc.backend.to_numpy(labels.data).copy()
    if use_torch:
        import torch

        graph, torch_eager = torch_pair(args, torch_device)
        torch_labels_before = graph.buffers["static_y"].cpu().numpy().copy()
    for _ in range(args.steps):
        churn(torch_device, use_torch)
        replay()
        eager()
        if use_torch:
            graph.step()
            torch_eager.step()
    cupy.cuda.Device().synchronize()
    result = {"batch": args.batch, "precision": args.precision, "model": args.model, "steps": args.steps,
              "cupy_pool": not args.no_cupy_pool}
    ours = {name: tc.backend.to_numpy(v) for name, v in model.state_dict().items()}
    reference = {name: tc.backend.to_numpy(v) for name, v in twin.state_dict().items()}
    diff = largest_relative_difference(reference, ours)
    labels_kept = bool(np.array_equal(tc.backend.to_numpy(labels.data), labels_before))
    result["ours"] = {"max_rel_diff_to_eager": diff, "labels_unchanged": labels_kept,
                      "graph_pool_bytes": runner.captured_bytes, "ok": diff <= 1e-5 and labels_kept}
    if use_torch:
        torch.cuda.synchronize()
        theirs = {k: v.detach().cpu().numpy() for k, v in graph.model.state_dict().items()}
        reference = {k: v.detach().cpu().numpy() for k, v in torch_eager.model.state_dict().items()}
        diff = largest_relative_difference(reference, theirs)
        labels_kept = bool(np.array_equal(graph.buffers["static_y"].cpu().numpy(), torch_labels_before))
        # Adam(capturable=True) computes on the device what Adam does on the host: rounding only
        result["torch_graph"] = {"max_rel_diff_to_eager": diff, "labels_unchanged": labels_kept,
                                 "ok": diff <= 1e-4 and labels_kept}
    runner.close()
    freed = getattr(cupy.cuda, "standin_freed_graph_buffers", None)  # the CPU stand-in's own record
    if freed is not None:
        result["ours"]["standin_freed_graph_buffers"] = freed()
        result["ours"]["ok"] = result["ours"]["ok"] and not freed()
    return result


def reproduce(args) -> None:
    """The first build_graph, in this process: ours captured and replayed as train_step.py does, then
    PyTorch's graph built with nothing holding its static inputs and optimizer, three eager PyTorch
    steps, the static labels' memory read raw, and a replay. Prints one JSON line per stage."""
    import cupy
    import torch

    from _torch_variants import build_eager, build_graph
    from train_step import seeded_state, set_precision, torch_batch, torch_model

    def say(**stage):
        print(json.dumps(stage), flush=True)

    device = tc.backend.normalize_device(args.device)
    torch_device = f"cuda:{tc.backend.cuda_index(device)}"
    set_precision(args.precision)
    (replay, _, _, _), _ = our_pair(args, device)
    replay()
    say(stage="ours captured and replayed")
    state = seeded_state()
    graph = build_graph(torch_model(state, torch_device), *torch_batch(args.batch, torch_device))
    pointer, count = graph.buffers["static_y"].data_ptr(), args.batch
    graph.buffers.clear()  # what the first version did: nothing held them once build_graph returned
    gc.collect()
    eager = build_eager(torch_model(state, torch_device), *torch_batch(args.batch, torch_device))
    for _ in range(3):
        eager.step()
    torch.cuda.synchronize()
    memory = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(pointer, count * 8, None), 0)
    held = cupy.ndarray((count,), dtype=cupy.int64, memptr=memory).get()
    say(stage="the static labels' memory after three eager PyTorch steps", values=held[:16].tolist(),
        all_in_0_to_9=bool(((held >= 0) & (held < 10)).all()))
    loss = graph.step()
    torch.cuda.synchronize()
    say(stage="replayed", loss=float(loss.item()))


def run_reproduction(args) -> dict:
    """``--reproduce`` in a process of its own: its stages, exit status and the end of its stderr."""
    command = [sys.executable, os.path.abspath(__file__), "--reproduce", "--batch", str(args.batch),
               "--precision", args.precision, "--device", args.device, "--model", args.model]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    stages = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    errors = [line for line in done.stderr.splitlines() if "assert" in line.lower() or "error" in line.lower()]
    return {"exit": done.returncode, "stages": stages, "errors": errors[-6:],
            "crashed": done.returncode != 0, "stderr_tail": done.stderr[-1500:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--precision", choices=["highest", "high"], default="highest")
    parser.add_argument("--model", choices=sorted(MODELS), default="full")
    parser.add_argument("--without-torch", action="store_true", help="our graph only")
    parser.add_argument("--no-cupy-pool", action="store_true",
                        help="CuPy allocates with cudaMalloc and frees with cudaFree outside a graph's pool "
                             "(for compute-sanitizer memcheck)")
    parser.add_argument("--no-reproduce", action="store_true", help="leave out the first recipe's reproduction")
    parser.add_argument("--reproduce", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not tc.gpu_available():
        print(f"graph_buffers_check.py needs a GPU: {tc.backend._gpu_status()[1]}", file=sys.stderr)
        return 2
    if args.model == "tiny" or args.model == "reduced" and not args.without_torch:
        args.without_torch = True  # TorchCapsNet has the paper's sizes only
    if not args.without_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            args.without_torch = True
    if args.no_cupy_pool:
        import cupy

        cupy.cuda.set_allocator(None)
    if args.reproduce:
        reproduce(args)
        return 0
    result = check(args)
    if not args.without_torch and not args.no_reproduce:
        result["first_torch_graph_recipe"] = run_reproduction(args)
    ok = result["ours"]["ok"] and result.get("torch_graph", {}).get("ok", True)
    result["ok"] = ok
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
