"""One CapsNet training step (forward, backward, Adam) at the paper's sizes, ours against PyTorch
eager on the same device in the same process (same allocator settings), timed in turns
(``--repeat`` steps of each, twice over; the median of each), with the ratio. On ``--device cuda``
(or ``cuda:N``) PyTorch runs on that GPU with cuDNN, whose version is printed; our step is timed
eager and captured as a CUDA graph (``tc.cuda_graphs``; the captured weights are checked against
the eager ones), at each ``--precision`` for both libraries ("highest": float32 products and
convolutions; "high": TF32, PyTorch's default for cuDNN convolutions on Ampere and Hopper).

Beside PyTorch eager, PyTorch at its best (``--torch-variants``, _torch_variants.py): the whole step
captured as one CUDA graph ("graph") and torch.compile in "reduce-overhead" and "max-autotune" modes,
each from the same weights and batch (first losses printed); on the CPU only eager runs, and each other
variant says why it is skipped. torch.compile's compile and warm-up time is reported apart
(``compile_s``), within ``--torch-compile-budget`` seconds for the whole run (reduce-overhead for every
(batch, precision) first, then max-autotune; what does not fit is skipped with the reason).

Each (batch, precision) also gets (_train_step_report.py): the step's FLOPs and least bytes
(step_cost.py), each variant's TFLOP/s against the GPU's datasheet FP32 ("highest") or TF32 ("high")
peak (gpu_peaks.py) and its bytes/s against a device-to-device copy timed in the same run
(routing_speed.py's ``copy_bandwidth``); on a GPU the host time of issuing a step (until the call
returns) and its CUDA-event time apart; the device memory a step needs above what was live before it
(ours: CuPy's pool; PyTorch: its allocator) and the bytes each CUDA graph keeps; the ratio of our
fastest step to PyTorch's fastest, and the goals (time <= 1.0x, moonshot 0.8x; captured memory <= 1.1x
the eager peak), met or not.

    python benchmarks/train_step.py [--batch 32 100] [--repeat 5] [--device cpu|cuda]
                                    [--precision highest high] [--no-cuda-graph] [--json]
                                    [--torch-variants eager graph compile-reduce-overhead compile-max-autotune]
                                    [--no-torch-compile] [--torch-compile-budget SECONDS]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as the CLI runs (tinygrad_caps_cli.py); before NumPy loads
import numpy as np  # noqa: E402

import tinygrad_caps as tc
from _steps import random_batch, seeded_capsnet, training_step
from _step_memory import captured_bytes, ours_step_peak_bytes, torch_step_peak_bytes
from _timing import describe_allocator, host_and_gpu_times, say_pytorch_missing, time_in_turns
from _torch_variants import COMPILE_MODES, VARIANTS, CompileTimeLimit, build_compiled, build_eager, build_graph, \
    unavailable_reason
from _train_step_report import KEYS, summarize, table
from gpu_peaks import peak_for
from routing_speed import copy_bandwidth
from step_cost import step_cost

try:
    import torch
    from torch_capsnet import TorchCapsNet
except ImportError:
    torch = None


def ours_step(batch, device, capturable=False):
    """(model, step, x, y, inputs) for our CapsNet: ``step()`` trains on the batch held in ``inputs``
    (device tensors, so that a captured step reads them from the same place)."""
    model = seeded_capsnet(device)
    x, y = random_batch(batch)
    xt, yt = tc.tensor(x, device=device), tc.tensor(y, device=device)
    _, step = training_step(model, xt, yt.data, capturable=capturable)
    return model, step, x, y, (xt, yt)


def captured_step(batch, device):
    """Our step captured as a CUDA graph (tc.cuda_graphs), warmed up and captured before timing;
    returns (model, replay, runner): ``replay()`` runs one step on the batch already in place,
    ``runner`` is the CapturedStep (it says what memory its graph keeps)."""
    from tinygrad_caps.cuda_graphs import CapturedStep

    model, step, x, y, inputs = ours_step(batch, device, capturable=True)
    runner = CapturedStep(step, inputs, warmup=2)
    device_batch = [t.data for t in inputs]
    for _ in range(3):  # two eager warm-up steps, then the capture (and its first replay)
        runner(*device_batch)
    runner.synchronize()

    def replay():
        return runner(*device_batch)

    return model, replay, runner


def graph_matches_eager(batch, device, steps=10) -> float:
    """The largest relative difference between the weights after ``steps`` captured and as many eager
    steps from the same start (float32 rounding: about 1e-7; a broken capture: order 1)."""
    eager_model, eager, *_ = ours_step(batch, device, capturable=True)
    for _ in range(steps):
        eager()
    graph_model, replay, _ = captured_step(batch, device)
    for _ in range(steps - 3):  # captured_step ran three steps already
        replay()
    worst = 0.0
    for (name, a), (_, b) in zip(eager_model.state_dict().items(), graph_model.state_dict().items()):
        a, b = tc.backend.to_numpy(a), tc.backend.to_numpy(b)
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)))
    return worst


def seeded_state() -> dict:
    """Our seeded CapsNet's weights as NumPy arrays (every PyTorch variant starts from them)."""
    return {k: tc.backend.to_numpy(v) for k, v in seeded_capsnet().state_dict().items()}


def torch_model(state, device):
    """A TorchCapsNet on ``device`` holding our weights ``state``."""
    model = TorchCapsNet().to(device)
    model.load_arrays(state)
    return model


def torch_batch(batch, device):
    """The batch ours trains on (``random_batch``), as torch tensors on ``device``."""
    x, y = random_batch(batch)
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def set_precision(precision: str) -> None:
    """The same matmul and convolution precision for both libraries: "highest" float32, "high" TF32."""
    tc.set_matmul_precision(precision)
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "high"


def say(message: str) -> None:
    """A progress line on stderr (the JSON, or the table, is what stdout ends with)."""
    print(f"# {message}", file=sys.stderr, flush=True)


def torch_plan(args, torch_device) -> tuple:
    """(variants to run, {variant: why it is skipped}) from --torch-variants and --no-torch-compile."""
    if torch is None:
        return [], {}
    run, skipped = [], {}
    for variant in dict.fromkeys(args.torch_variants):
        reason = unavailable_reason(variant, torch_device)
        if reason is None and args.no_torch_compile and variant in COMPILE_MODES:
            reason = "--no-torch-compile"
        if reason is None:
            run.append(variant)
        else:
            skipped[variant] = reason
    return run, skipped


def prepare_compiled(cells, variants, torch_device, state, budget_s) -> dict:
    """torch.compile's variants for every (precision, batch) in ``cells``, compiled and warmed up
    before any timing, within ``budget_s`` seconds in all: "reduce-overhead" for every cell first, then
    "max-autotune"; returns {(precision, batch): {variant: TorchStep or the reason it is skipped}}."""
    prepared = {cell: {} for cell in cells}
    deadline = time.perf_counter() + budget_s
    for variant in [v for v in COMPILE_MODES if v in variants]:
        for precision, batch in cells:
            left = deadline - time.perf_counter()
            if left <= 0:
                prepared[(precision, batch)][variant] = (f"the {budget_s:.0f} s compile budget "
                                                         "(--torch-compile-budget) was spent before it")
                continue
            set_precision(precision)
            say(f"compiling torch-{variant} at B={batch}, {precision} (at most {left:.0f} s)")
            x, y = torch_batch(batch, torch_device)
            try:
                prepared[(precision, batch)][variant] = build_compiled(torch_model(state, torch_device), x, y, variant,
                                                                       limit_s=left)
            except CompileTimeLimit as exc:
                prepared[(precision, batch)][variant] = str(exc)
            except Exception as exc:  # noqa: BLE001  (a variant that fails is reported; the others still run)
                prepared[(precision, batch)][variant] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
    set_precision("highest")
    return prepared


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 100])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", nargs="+", choices=["highest", "high"], default=None,
                        help="matmul/convolution precision for both libraries (default: both on a GPU, highest on the CPU)")
    parser.add_argument("--no-cuda-graph", action="store_true", help="on a GPU, time the eager step only")
    parser.add_argument("--torch-variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="PyTorch's steps to time beside ours (default: all; on the CPU only eager runs)")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="leave out torch.compile's variants (their compile takes minutes)")
    parser.add_argument("--torch-compile-budget", type=float, default=300.0, metavar="SECONDS",
                        help="seconds for torch.compile's compiles and warm-ups in all (default 300); what does not "
                             "fit is skipped with the reason")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = tc.backend.normalize_device(args.device)
    on_gpu = device.startswith("cuda")
    sync = None
    torch_device = "cpu"
    if on_gpu:
        import cupy

        index = tc.backend.cuda_index(device)
        cupy.cuda.Device(index).use()
        sync = cupy.cuda.Device().synchronize
        torch_device = f"cuda:{index}"
        if torch is not None and not torch.cuda.is_available():
            raise SystemExit("train_step.py --device cuda compares with PyTorch on CUDA, but this PyTorch has no CUDA")
        if torch is not None:
            torch.cuda.set_device(index)
    precisions = args.precision or (["highest", "high"] if on_gpu else ["highest"])
    graphs = on_gpu and not args.no_cuda_graph
    variants, skipped = torch_plan(args, torch_device)
    gpu_name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode() if on_gpu else None
    bandwidth = copy_bandwidth("cuda" if on_gpu else "cpu")
    peak = peak_for(gpu_name) if on_gpu else None
    cells = [(precision, batch) for precision in precisions for batch in args.batch]
    state = seeded_state() if torch is not None else None
    prepared = prepare_compiled(cells, variants, torch_device, state, args.torch_compile_budget) if variants else {}
    rows = []
    for precision, batch in cells:
        set_precision(precision)
        say(f"timing B={batch}, {precision}")
        row = measure(batch, device, torch_device, precision, graphs, args.repeat, sync, variants=variants,
                      skipped=skipped, prepared=prepared.get((precision, batch), {}), state=state)
        rows.append(summarize(row, step_cost(batch), peak, bandwidth))
    set_precision("highest")
    info = {"device": device, "machine": platform.processor() or platform.machine(), "allocator": describe_allocator(),
            "torch": getattr(torch, "__version__", None),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "torch_variants": variants, "torch_variants_skipped": skipped,
            "torch_compile_budget_s": args.torch_compile_budget,
            "copy_bandwidth_bytes_per_s": bandwidth, "peak": None if peak is None else peak._asdict()}
    if on_gpu:
        info["gpu"] = gpu_name
        info["cudnn"] = torch.backends.cudnn.version() if torch is not None and torch.backends.cudnn.is_available() else None
    else:
        info["not_measured_here"] = ("host and GPU time apart, and device memory, are measured on a GPU only "
                                     "(memory.py measures the CPU's)")
    if torch is None:
        say_pytorch_missing(args.json)
    sys.stderr.flush()
    if args.json:
        print(json.dumps({"info": info, "rows": rows}, indent=2))
        return
    print(f"# {info}")
    for r in rows:
        line = f"B={r['batch']:<4} {r['precision']:<8} ours {r['ours_s'] * 1e3:7.2f} ms/step"
        if "ours_graph_s" in r:
            line += f"   captured {r['ours_graph_s'] * 1e3:7.2f} ms (weights vs eager: {r['graph_max_rel_diff']:.1e})"
        if "torch_s" in r:
            line += (f"   PyTorch {r['torch_s'] * 1e3:7.2f} ms   ratio {r['ratio']:.2f}   "
                     f"(first losses {r['first_loss_ours']:.5f} / {r['first_loss_torch']:.5f})")
        print(line)
    for line in table(rows):
        print(line)


def measure(batch, device, torch_device, precision, graphs, repeat, sync, variants=("eager",), skipped=None,
            prepared=None, state=None) -> dict:
    """One row: our eager step, our captured step (``graphs``) and PyTorch's ``variants`` (eager and
    graph built here; the compiled ones taken ready from ``prepared``), timed in turns; then, on a GPU,
    host and GPU time apart and the device memory of each. ``skipped``: {variant: why} for the row."""
    model, step, x, y, _ = ours_step(batch, device)
    row = {"batch": batch, "precision": precision}
    row["first_loss_ours"] = step().item()
    figures = {"ours-eager": {"first_loss": row["first_loss_ours"]}}
    fns, syncs = {"ours": step}, {"ours": sync}
    runner = None
    if graphs:
        row["graph_max_rel_diff"] = graph_matches_eager(batch, device)
        _, fns["ours_graph"], runner = captured_step(batch, device)
        syncs["ours_graph"] = sync
        figures["ours-captured"] = {"graph_bytes": captured_bytes(runner)}
    elif device.startswith("cuda"):
        figures["ours-captured"] = {"skipped": "--no-cuda-graph"}
    else:
        figures["ours-captured"] = {"skipped": "CUDA graphs need a GPU; this run is on the CPU"}
    built = {}
    if torch is not None:
        state = state if state is not None else seeded_state()
        torch_sync = torch.cuda.synchronize if torch_device != "cpu" else None
        for variant in variants:
            name = f"torch-{variant}"
            try:
                if variant == "eager":
                    built[name] = build_eager(torch_model(state, torch_device), *torch_batch(batch, torch_device))
                elif variant == "graph":
                    built[name] = build_graph(torch_model(state, torch_device), *torch_batch(batch, torch_device))
                elif isinstance((prepared or {}).get(variant), str):
                    figures[name] = {"skipped": prepared[variant]}
                elif variant in (prepared or {}):
                    built[name] = prepared[variant]
            except Exception as exc:  # noqa: BLE001  (a variant that fails is reported; the others still run)
                figures[name] = {"skipped": f"failed: {type(exc).__name__}: {str(exc)[:300]}"}
        for variant, reason in (skipped or {}).items():
            figures[f"torch-{variant}"] = {"skipped": reason}
        for name, built_step in built.items():
            fns[KEYS[name]], syncs[KEYS[name]] = built_step.step, torch_sync
            figures[name] = {"first_loss": built_step.first_loss, "compile_s": built_step.compile_s,
                             "graph_bytes": built_step.graph_bytes}
        if "torch-eager" in built:
            row["first_loss_torch"] = built["torch-eager"].first_loss
    times = time_in_turns(fns, repeat, syncs=syncs)
    names = {key: name for name, key in KEYS.items()}
    for key in fns:
        row[f"{key}_s"] = times[key]["median"]
        figures[names[key]]["s"] = times[key]["median"]
        figures[names[key]]["spread_s"] = [times[key]["min"], times[key]["max"]]
    if torch is not None and "torch_s" in row:
        best = row.get("ours_graph_s", row["ours_s"])
        row["ratio"] = best / row["torch_s"]  # our fastest step against PyTorch's eager step
        row["ratio_eager"] = row["ours_s"] / row["torch_s"]
    if device.startswith("cuda"):
        parameters = {"ours": list(model.parameters())}
        if "torch-eager" in built:
            parameters["torch"] = list(built["torch-eager"].model.parameters())
        measure_on_gpu(fns, figures, names, repeat, parameters)
    order = ["ours-eager", "ours-captured"] + [f"torch-{v}" for v in VARIANTS]
    row["variants"] = {name: figures[name] for name in order if name in figures}
    if runner is not None:
        runner.close()
    return row


def measure_on_gpu(fns, figures, names, repeat, parameters) -> None:
    """Host and GPU time of each step apart, and the device memory one step needs above what was live
    before it (into ``figures``); ``parameters``: {key: the parameters whose gradients an eager step
    remakes} (_step_memory.py)."""
    for key, fn in fns.items():
        name = names[key]
        library = "cupy" if key.startswith("ours") else "torch"
        times = host_and_gpu_times(fn, library, repeat)
        figures[name]["host_s"], figures[name]["gpu_s"] = times["host_s"], times["gpu_s"]
        measure_peak = ours_step_peak_bytes if library == "cupy" else torch_step_peak_bytes
        try:
            figures[name]["peak_bytes"] = measure_peak(fn, parameters.get(key))
        except Exception as exc:  # noqa: BLE001  (a figure that cannot be read is said, not fatal)
            figures[name]["peak_bytes_error"] = f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    main()
