"""One CapsNet training step (forward, backward, Adam) at the paper's sizes, ours against PyTorch
eager on the same device in the same process (same allocator settings), timed in turns
(``--repeat`` steps of each, twice over; the median of each), with the ratio. On ``--device cuda``
(or ``cuda:N``) PyTorch runs on that GPU with cuDNN, whose version is printed; our step is timed
eager and captured as a CUDA graph (``tc.cuda_graphs``; the captured weights are checked against
the eager ones), at each ``--precision`` for both libraries ("highest": float32 products and
convolutions; "high": TF32, PyTorch's default for cuDNN convolutions on Ampere and Hopper).

    python benchmarks/train_step.py [--batch 32 100] [--repeat 5] [--device cpu|cuda]
                                    [--precision highest high] [--no-cuda-graph] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as the CLI runs (tinygrad_caps_cli.py); before NumPy loads
import numpy as np  # noqa: E402

import tinygrad_caps as tc
from _steps import random_batch, seeded_capsnet, torch_training_step, training_step
from _timing import describe_allocator, say_pytorch_missing, time_call, time_in_turns

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
    returns (model, replay): ``replay()`` runs one step on the batch already in place."""
    from tinygrad_caps.cuda_graphs import CapturedStep

    model, step, x, y, inputs = ours_step(batch, device, capturable=True)
    runner = CapturedStep(step, inputs, warmup=2)
    device_batch = [t.data for t in inputs]
    for _ in range(3):  # two eager warm-up steps, then the capture (and its first replay)
        runner(*device_batch)
    runner.synchronize()
    return model, lambda: runner(*device_batch)


def graph_matches_eager(batch, device, steps=10) -> float:
    """The largest relative difference between the weights after ``steps`` captured and as many eager
    steps from the same start (float32 rounding: about 1e-7; a broken capture: order 1)."""
    eager_model, eager, *_ = ours_step(batch, device, capturable=True)
    for _ in range(steps):
        eager()
    graph_model, replay = captured_step(batch, device)
    for _ in range(steps - 3):  # captured_step ran three steps already
        replay()
    worst = 0.0
    for (name, a), (_, b) in zip(eager_model.state_dict().items(), graph_model.state_dict().items()):
        a, b = tc.backend.to_numpy(a), tc.backend.to_numpy(b)
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)))
    return worst


def torch_step(batch, device, state, x, y):
    """PyTorch's step from our weights ``state`` on the same batch (x, y)."""
    model = TorchCapsNet().to(device)
    model.load_arrays(state)
    return torch_training_step(model, torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))


def set_precision(precision: str) -> None:
    """The same matmul and convolution precision for both libraries: "highest" float32, "high" TF32."""
    tc.set_matmul_precision(precision)
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "high"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 100])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", nargs="+", choices=["highest", "high"], default=None,
                        help="matmul/convolution precision for both libraries (default: both on a GPU, highest on the CPU)")
    parser.add_argument("--no-cuda-graph", action="store_true", help="on a GPU, time the eager step only")
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
    precisions = args.precision or (["highest", "high"] if on_gpu else ["highest"])
    graphs = on_gpu and not args.no_cuda_graph
    rows = []
    for precision in precisions:
        set_precision(precision)
        for batch in args.batch:
            rows.append(measure(batch, device, torch_device, precision, graphs, args.repeat, sync))
    set_precision("highest")
    info = {"device": device, "machine": platform.processor() or platform.machine(), "allocator": describe_allocator(),
            "torch": getattr(torch, "__version__", None),
            "torch_threads": torch.get_num_threads() if torch is not None else None}
    if on_gpu:
        info["gpu"] = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        info["cudnn"] = torch.backends.cudnn.version() if torch is not None and torch.backends.cudnn.is_available() else None
    if torch is None:
        say_pytorch_missing(args.json)
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


def measure(batch, device, torch_device, precision, graphs, repeat, sync) -> dict:
    """One row: our eager step, our captured step (``graphs``) and PyTorch's, timed in turns."""
    model, step, x, y, _ = ours_step(batch, device)
    row = {"batch": batch, "precision": precision}
    row["first_loss_ours"] = step().item()
    fns, syncs = {"ours": step}, {"ours": sync}
    if graphs:
        row["graph_max_rel_diff"] = graph_matches_eager(batch, device)
        fns["ours_graph"], syncs["ours_graph"] = captured_step(batch, device)[1], sync
    if torch is not None:
        state = {k: tc.backend.to_numpy(v) for k, v in seeded_capsnet().state_dict().items()}
        tstep = torch_step(batch, torch_device, state, x, y)
        row["first_loss_torch"] = tstep().item()
        fns["torch"], syncs["torch"] = tstep, torch.cuda.synchronize if torch_device != "cpu" else None
    times = time_in_turns(fns, repeat, syncs=syncs)
    for name in fns:
        row[f"{name}_s"] = times[name]["median"]
    if torch is not None:
        best = row.get("ours_graph_s", row["ours_s"])
        row["ratio"] = best / row["torch_s"]  # our fastest step against PyTorch's eager step
        row["ratio_eager"] = row["ours_s"] / row["torch_s"]
    return row


if __name__ == "__main__":
    main()
