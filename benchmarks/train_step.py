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

A crash costs its own cell, never the table (``--isolate``, the default on a GPU: a CUDA device-side
assert poisons its whole process, as PyTorch's captured step did on the H200 of 2026-11-28). Each
variant (ours eager and captured, PyTorch eager and graph) first runs its first steps at every
(batch, precision) in a process of its own (_isolated.py); each (batch, precision) is then timed in a
process of its own, the variants that survived their probe in turns; each torch.compile variant is
compiled and timed in a process of its own per (batch, precision), within what is left of
``--torch-compile-budget`` (its compile time reported; one that does not compile in time says how long
it ran). A variant that failed has the reason in its cell. ``--partial-json PATH`` keeps what is
gathered so far after each stage. ``--no-isolate`` runs everything in this process.

    python benchmarks/train_step.py [--batch 32 100] [--repeat 5] [--device cpu|cuda]
                                    [--precision highest high] [--no-cuda-graph] [--json]
                                    [--torch-variants eager graph compile-reduce-overhead compile-max-autotune]
                                    [--no-torch-compile] [--torch-compile-budget SECONDS]
                                    [--isolate | --no-isolate] [--cell-timeout SECONDS] [--partial-json PATH]

torch.compile in max-autotune mode is timed in a call of its own (its compile alone takes minutes):

    python benchmarks/train_step.py --device cuda --batch 100 --precision highest \
        --torch-variants compile-max-autotune --torch-compile-budget 360 --json
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


def parse_args(argv=None):
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
                             "fit is skipped with the reason and the time it reached")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                       help="each variant's first steps, each (batch, precision) and each torch.compile variant in a "
                            "process of its own (the default on a GPU): a crash costs its own cell")
    where.add_argument("--no-isolate", dest="isolate", action="store_false", help="everything in this process")
    parser.add_argument("--cell-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="the longest a process of its own may take for one cell (default 300)")
    parser.add_argument("--partial-json", default=None, metavar="PATH",
                        help="write the figures gathered so far to PATH after each stage (isolated runs)")
    parser.add_argument("--json", action="store_true")
    # what a process of its own is asked to do (see isolated_main)
    parser.add_argument("--probe", choices=CHILD_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--cells", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--time-cell", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ours", nargs="*", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--time-torch", nargs="*", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile", choices=list(COMPILE_MODES), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=float, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def setup(args) -> dict:
    """The run's devices, made current: {"device", "on_gpu", "sync", "torch_device"} (a GPU run
    initializes CUDA in this process)."""
    device = tc.backend.normalize_device(args.device)
    on_gpu = device.startswith("cuda")
    sync, torch_device = None, "cpu"
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
    return {"device": device, "on_gpu": on_gpu, "sync": sync, "torch_device": torch_device}


def gpu_name_of(on_gpu: bool):
    if not on_gpu:
        return None
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()


def run_info(args, ctx, variants, skipped, bandwidth, peak, gpu_name) -> dict:
    """The run's description (the JSON's "info")."""
    info = {"device": ctx["device"], "machine": platform.processor() or platform.machine(),
            "allocator": describe_allocator(), "torch": getattr(torch, "__version__", None),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "torch_variants": variants, "torch_variants_skipped": skipped,
            "torch_compile_budget_s": args.torch_compile_budget, "isolated": bool(args.isolate),
            "copy_bandwidth_bytes_per_s": bandwidth, "peak": None if peak is None else peak._asdict()}
    if ctx["on_gpu"]:
        info["gpu"] = gpu_name
        info["cudnn"] = torch.backends.cudnn.version() if torch is not None and torch.backends.cudnn.is_available() else None
    else:
        info["not_measured_here"] = ("host and GPU time apart, and device memory, are measured on a GPU only "
                                     "(memory.py measures the CPU's)")
    return info


def main(argv=None):
    args = parse_args(argv)
    if args.probe or args.time_cell or args.compile:
        return isolated_main(args)
    device = tc.backend.normalize_device(args.device)
    on_gpu = device.startswith("cuda")
    if args.isolate is None:
        args.isolate = on_gpu
    precisions = args.precision or (["highest", "high"] if on_gpu else ["highest"])
    cells = [(precision, batch) for precision in precisions for batch in args.batch]
    if args.isolate:
        result = run_isolated(args, device, cells)
    else:
        result = run_here(args, cells)
    if torch is None:
        say_pytorch_missing(args.json)
    sys.stderr.flush()
    print_result(result, args.json)


def run_here(args, cells) -> dict:
    """Every cell in this process (what train_step.py did before --isolate): {"info", "rows"}."""
    ctx = setup(args)
    graphs = ctx["on_gpu"] and not args.no_cuda_graph
    variants, skipped = torch_plan(args, ctx["torch_device"])
    gpu_name = gpu_name_of(ctx["on_gpu"])
    bandwidth = copy_bandwidth("cuda" if ctx["on_gpu"] else "cpu")
    peak = peak_for(gpu_name) if ctx["on_gpu"] else None
    state = seeded_state() if torch is not None else None
    prepared = prepare_compiled(cells, variants, ctx["torch_device"], state, args.torch_compile_budget) \
        if variants else {}
    rows = []
    for precision, batch in cells:
        set_precision(precision)
        say(f"timing B={batch}, {precision}")
        row = measure(batch, ctx["device"], ctx["torch_device"], precision, graphs, args.repeat, ctx["sync"],
                      variants=variants, skipped=skipped, prepared=prepared.get((precision, batch), {}), state=state)
        rows.append(summarize(row, step_cost(batch), peak, bandwidth))
    set_precision("highest")
    return {"info": run_info(args, ctx, variants, skipped, bandwidth, peak, gpu_name), "rows": rows}


def print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    print(f"# {result['info']}")
    for r in result["rows"]:
        if "ours_s" not in r:
            print(f"B={r['batch']:<4} {r['precision']:<8} ours: not timed ({r.get('failed', 'see the variants')})")
            continue
        line = f"B={r['batch']:<4} {r['precision']:<8} ours {r['ours_s'] * 1e3:7.2f} ms/step"
        if "ours_graph_s" in r:
            line += f"   captured {r['ours_graph_s'] * 1e3:7.2f} ms (weights vs eager: {r['graph_max_rel_diff']:.1e})"
        if "torch_s" in r:
            line += (f"   PyTorch {r['torch_s'] * 1e3:7.2f} ms   ratio {r['ratio']:.2f}   "
                     f"(first losses {r['first_loss_ours']:.5f} / {r['first_loss_torch']:.5f})")
        print(line)
    for line in table(result["rows"]):
        print(line)


# ----- processes of their own: probes, one process per cell, torch.compile apart -----
CHILD_VARIANTS = ("ours-eager", "ours-captured", "torch-eager", "torch-graph")
FAIL_ENV = "TRAIN_STEP_FAIL"  # for this script's tests: "VARIANT@BATCH" crashes that variant's probe there


def cell_text(cells) -> str:
    return ",".join(f"{precision}:{batch}" for precision, batch in cells)


def parse_cells(text: str) -> list:
    return [(part.split(":")[0], int(part.split(":")[1])) for part in text.split(",") if part]


def child_command(args, *extra) -> list:
    """This script with the run's options and ``extra`` (a child's task)."""
    command = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--repeat", str(args.repeat)]
    if args.no_cuda_graph:
        command.append("--no-cuda-graph")
    return command + [str(part) for part in extra]


def isolated_main(args) -> int:
    """A child's task: ``--probe`` (a variant's first steps at ``--cells``), ``--time-cell`` (one row,
    our variants ``--ours`` and PyTorch's ``--torch-variants`` timed in turns) or ``--compile`` (one
    torch.compile variant compiled within ``--limit`` seconds, then timed). Reports JSON lines."""
    from _isolated import emit

    ctx = setup(args)
    state = seeded_state() if torch is not None else None
    if args.probe:
        for precision, batch in parse_cells(args.cells):
            set_precision(precision)
            emit(cell=[precision, batch], ok=True, first_loss=probe_variant(args.probe, batch, ctx, state))
        return 0
    precision, batch = parse_cells(args.time_cell)[0]
    set_precision(precision)
    if args.compile:
        emit(cell=[precision, batch], ok=True, figures=time_compiled(args, ctx, state, batch))
        return 0
    ours = args.ours if args.ours is not None else ["ours-eager", "ours-captured"]
    graphs = ctx["on_gpu"] and "ours-captured" in ours and not args.no_cuda_graph
    asked = args.time_torch if args.time_torch is not None else args.torch_variants
    torch_variants = [v for v in asked if v in ("eager", "graph")] if torch is not None else []
    row = measure(batch, ctx["device"], ctx["torch_device"], precision, graphs, args.repeat, ctx["sync"],
                  variants=torch_variants, state=state, ours_eager="ours-eager" in ours)
    gpu_name = gpu_name_of(ctx["on_gpu"])
    emit(cell=[precision, batch], ok=True, row=row, gpu=gpu_name,
         bandwidth=copy_bandwidth("cuda" if ctx["on_gpu"] else "cpu"),
         cudnn=torch.backends.cudnn.version() if torch is not None and torch.backends.cudnn.is_available() else None)
    return 0


def probe_variant(variant: str, batch: int, ctx: dict, state) -> float:
    """Build ``variant`` at ``batch`` and run its first steps to the end of the device's work; its first loss."""
    failing = os.environ.get(FAIL_ENV, "")
    if failing == f"{variant}@{batch}":
        print("train_step.py: ScatterGatherKernel.cu:409: Assertion `idx_dim >= 0 && idx_dim < index_size && "
              "\"index out of bounds\"` failed (simulated for the tests)", file=sys.stderr, flush=True)
        os.abort()
    sync = ctx["sync"] or (lambda: None)
    if variant == "ours-eager":
        _, step, *_ = ours_step(batch, ctx["device"])
        first = step().item()
        step()
    elif variant == "ours-captured":
        _, replay, runner = captured_step(batch, ctx["device"])
        replay()
        sync()
        first = float("nan")  # a replay returns nothing; the eager probe has the loss
        runner.close()
    else:
        build = build_eager if variant == "torch-eager" else build_graph
        built = build(torch_model(state, ctx["torch_device"]), *torch_batch(batch, ctx["torch_device"]))
        for _ in range(2):
            built.step()
        torch.cuda.synchronize() if ctx["on_gpu"] else None
        first = built.first_loss
    sync()
    return first


def time_compiled(args, ctx, state, batch) -> dict:
    """One torch.compile variant at ``batch``: compiled within ``args.limit`` seconds, then timed
    (``args.repeat`` steps, twice) with host and GPU time apart and its step's memory."""
    limit = args.limit
    x, y = torch_batch(batch, ctx["torch_device"])
    say(f"compiling torch-{args.compile} at B={batch} (at most {limit:.0f} s)")
    built = build_compiled(torch_model(state, ctx["torch_device"]), x, y, args.compile, limit_s=limit)
    torch_sync = torch.cuda.synchronize if ctx["on_gpu"] else None
    times = time_in_turns({"compiled": built.step}, args.repeat, syncs={"compiled": torch_sync})["compiled"]
    figures = {"first_loss": built.first_loss, "compile_s": built.compile_s, "s": times["median"],
               "spread_s": [times["min"], times["max"]], "timed": "in a process of its own"}
    if ctx["on_gpu"]:
        apart = host_and_gpu_times(built.step, "torch", args.repeat)
        figures.update(host_s=apart["host_s"], gpu_s=apart["gpu_s"])
        figures["peak_bytes"] = torch_step_peak_bytes(built.step)  # as measure_on_gpu does for a compiled step
    return figures


def write_partial(path, result) -> None:
    if path:
        temporary = f"{path}.tmp"
        with open(temporary, "w") as out:
            json.dump(result, out, indent=2)
        os.replace(temporary, path)


def run_isolated(args, device: str, cells: list) -> dict:
    """Probe each variant's first steps, then time each cell, then compile and time torch.compile's
    variants, each in processes of their own (see the module docstring); {"info", "rows"}."""
    from _isolated import failure_reason, probe, run_child

    on_gpu = device.startswith("cuda")
    here = os.path.dirname(os.path.abspath(__file__))
    variants, skipped = torch_plan(args, f"cuda:{tc.backend.cuda_index(device)}" if on_gpu else "cpu")
    ours = ["ours-eager"] + (["ours-captured"] if on_gpu and not args.no_cuda_graph else [])
    in_process = ours + [f"torch-{v}" for v in variants if v in ("eager", "graph")]
    failed = {cell: {} for cell in cells}  # {cell: {variant: why}}
    for variant in in_process:
        say(f"probing {variant}'s first steps in a process of its own")
        outcome = probe(variant, cells,
                        lambda v, left: child_command(args, "--probe", v, "--cells", cell_text(left),
                                                      "--torch-variants", *args.torch_variants),
                        args.cell_timeout, cwd=here)
        for cell, why in outcome.items():
            if why is not None:
                failed[cell][variant] = why
    rows, info_bits = [], {}
    for precision, batch in cells:
        cell = (precision, batch)
        alive = [v for v in in_process if v not in failed[cell]]
        say(f"timing B={batch}, {precision} in a process of its own: {', '.join(alive) or 'nothing survived'}")
        row = {"batch": batch, "precision": precision, "variants": {}}
        if alive:
            torch_alive = [v[len("torch-"):] for v in alive if v.startswith("torch-")]
            result = run_child(child_command(args, "--time-cell", cell_text([cell]), "--ours",
                                             *[v for v in alive if v.startswith("ours")],
                                             "--time-torch", *torch_alive),
                               args.cell_timeout, cwd=here)
            reports = [line for line in result.lines if line.get("ok") and "row" in line]
            if reports:
                row = reports[-1]["row"]
                info_bits = {k: reports[-1][k] for k in ("gpu", "bandwidth", "cudnn")}
            else:
                row["failed"] = failure_reason(result, "the cell's timing")
                for variant in alive:
                    row["variants"][variant] = {"skipped": row["failed"]}
        for variant, why in failed[cell].items():
            row["variants"][variant] = {"skipped": why}
        rows.append(row)
        write_partial(args.partial_json, {"info": {"stage": "cells"}, "rows": rows})
    deadline = time.perf_counter() + args.torch_compile_budget
    for variant in [v for v in COMPILE_MODES if v in variants]:
        for row in rows:
            name, left = f"torch-{variant}", deadline - time.perf_counter()
            if left <= 0:
                row["variants"][name] = {"skipped": f"the {args.torch_compile_budget:.0f} s compile budget "
                                                    "(--torch-compile-budget) was spent before it"}
                continue
            say(f"compiling and timing {name} at B={row['batch']}, {row['precision']} in a process of its own "
                f"(compile at most {left:.0f} s)")
            result = run_child(child_command(args, "--compile", variant, "--time-cell",
                                             cell_text([(row["precision"], row["batch"])]), "--limit", f"{left:.0f}"),
                               left + args.cell_timeout, cwd=here)
            reports = [line for line in result.lines if line.get("ok") and "figures" in line]
            if reports:
                row["variants"][name] = reports[-1]["figures"]
                row[f"{KEYS[name]}_s"] = reports[-1]["figures"]["s"]
            else:
                why = failure_reason(result, "its compile")
                if "CompileTimeLimit" in result.stderr_tail or result.exit is None:
                    why = (f"did not compile within {left:.0f} s (it reached {result.seconds:.0f} s in a process of "
                           f"its own): {why}")
                row["variants"][name] = {"skipped": why}
            write_partial(args.partial_json, {"info": {"stage": "compile"}, "rows": rows})
    gpu_name, bandwidth = info_bits.get("gpu"), info_bits.get("bandwidth")
    peak = peak_for(gpu_name) if on_gpu and gpu_name else None
    order = ["ours-eager", "ours-captured"] + [f"torch-{v}" for v in VARIANTS]
    for row in rows:
        for variant, reason in skipped.items():
            row["variants"].setdefault(f"torch-{variant}", {"skipped": reason})
        row["variants"] = {name: row["variants"][name] for name in order if name in row["variants"]}
        summarize(row, step_cost(row["batch"]), peak, bandwidth)
    ctx = {"device": device, "on_gpu": on_gpu}
    info = run_info(args, ctx, variants, skipped, bandwidth, peak, gpu_name)
    if on_gpu:
        info["cudnn"] = info_bits.get("cudnn")
    result = {"info": info, "rows": rows}
    write_partial(args.partial_json, result)
    return result


def measure(batch, device, torch_device, precision, graphs, repeat, sync, variants=("eager",), skipped=None,
            prepared=None, state=None, ours_eager: bool = True) -> dict:
    """One row: our eager step (``ours_eager``), our captured step (``graphs``) and PyTorch's
    ``variants`` (eager and graph built here; the compiled ones taken ready from ``prepared``), timed in
    turns; then, on a GPU, host and GPU time apart and the device memory of each. ``skipped``:
    {variant: why} for the row."""
    row = {"batch": batch, "precision": precision}
    figures, fns, syncs, model = {}, {}, {}, None
    if ours_eager:
        model, step, x, y, _ = ours_step(batch, device)
        row["first_loss_ours"] = step().item()
        figures["ours-eager"] = {"first_loss": row["first_loss_ours"]}
        fns["ours"], syncs["ours"] = step, sync
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
    if torch is not None and "torch_s" in row and ("ours_s" in row or "ours_graph_s" in row):
        best = row.get("ours_graph_s", row.get("ours_s"))
        row["ratio"] = best / row["torch_s"]  # our fastest step against PyTorch's eager step
        if "ours_s" in row:
            row["ratio_eager"] = row["ours_s"] / row["torch_s"]
    if device.startswith("cuda"):
        parameters = {"ours": list(model.parameters())} if model is not None else {}
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
    sys.exit(main())
