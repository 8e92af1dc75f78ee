"""One CapsNet training step (forward, backward, Adam) at the paper's sizes, ours against PyTorch
eager on the same device in the same process (same allocator settings), timed in turns
(``--repeat`` steps of ours, as many of PyTorch's, twice over; the median of each), with the ratio. On
``--device cuda`` (or ``cuda:N``) PyTorch runs on that GPU with cuDNN, whose version is printed.

    python benchmarks/train_step.py [--batch 32 100] [--repeat 5] [--device cpu|cuda] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as the CLI runs (tinygrad_caps_cli.py); before NumPy loads
import numpy as np  # noqa: E402

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet, capsule_loss
from _timing import describe_allocator, say_pytorch_missing, time_call, time_in_turns

try:
    import torch
    from torch_capsnet import TorchCapsNet
except ImportError:
    torch = None


def ours_step(batch, device):
    tc.manual_seed(0)
    model = CapsNet().to(device=device)
    optimizer = tc.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, batch)
    xt = tc.tensor(x, device=device)

    def step():
        _, lengths, recon = model(xt, y)
        loss = capsule_loss(lengths, recon, xt, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return model, step, x, y


def torch_step(batch, device, state, x, y):
    model = TorchCapsNet().to(device)
    model.load_arrays(state)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)

    def step():
        loss = model(xt, yt)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 100])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = tc.backend.normalize_device(args.device)
    sync = None
    torch_device = "cpu"
    if device.startswith("cuda"):
        import cupy

        index = tc.backend.cuda_index(device)
        cupy.cuda.Device(index).use()
        sync = cupy.cuda.Device().synchronize
        torch_device = f"cuda:{index}"
        if torch is not None and not torch.cuda.is_available():
            raise SystemExit("train_step.py --device cuda compares with PyTorch on CUDA, but this PyTorch has no CUDA")
    rows = []
    for batch in args.batch:
        model, step, x, y = ours_step(batch, device)
        first_ours = step().item()
        row = {"batch": batch}
        if torch is None:
            row["ours_s"] = time_call(step, args.repeat, sync=sync)["median"]
        else:
            _, _, fresh_x, fresh_y = ours_step(batch, "cpu")
            tc.manual_seed(0)
            state = {k: tc.backend.to_numpy(v) for k, v in CapsNet().state_dict().items()}
            tstep = torch_step(batch, torch_device, state, fresh_x, fresh_y)
            first_torch = tstep().item()
            torch_sync = torch.cuda.synchronize if torch_device != "cpu" else None
            times = time_in_turns({"ours": step, "torch": tstep}, args.repeat,
                                  syncs={"ours": sync, "torch": torch_sync})
            row["ours_s"], row["torch_s"] = times["ours"]["median"], times["torch"]["median"]
            row["ratio"] = row["ours_s"] / row["torch_s"]
            row["first_loss_ours"], row["first_loss_torch"] = first_ours, first_torch
        rows.append(row)
    info = {"device": device, "machine": platform.processor() or platform.machine(), "allocator": describe_allocator(),
            "torch": getattr(torch, "__version__", None),
            "torch_threads": torch.get_num_threads() if torch is not None else None}
    if device.startswith("cuda"):
        info["gpu"] = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        info["cudnn"] = torch.backends.cudnn.version() if torch is not None and torch.backends.cudnn.is_available() else None
    if torch is None:
        say_pytorch_missing(args.json)
    if args.json:
        print(json.dumps({"info": info, "rows": rows}, indent=2))
        return
    print(f"# {info}")
    for r in rows:
        line = f"B={r['batch']:<4} ours {r['ours_s']:.3f} s/step"
        if "torch_s" in r:
            line += (f"   PyTorch {r['torch_s']:.3f} s/step   ratio {r['ratio']:.2f}   "
                     f"(first losses {r['first_loss_ours']:.5f} / {r['first_loss_torch']:.5f})")
        print(line)


if __name__ == "__main__":
    main()
