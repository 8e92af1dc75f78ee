"""Engine overhead and convolution speed on the CPU, against PyTorch in the same process.

(1) Python overhead per op node: a chain of small ops, forward and forward+backward.
(2) conv2d forward+backward at CapsNet's PrimaryCaps shape (x (100,256,20,20), w (256,256,9,9),
    stride 2) and Conv1 shape (x (100,1,28,28), w (256,1,9,9)), in float32.
(3) Gradient copies: how many gradient arrays backward had to copy in one CapsNet training step
    because they were not its own (a view, read-only, or shared with another gradient), against
    the number of gradients it handed out.

Both implementations run in this process, so they share the allocator settings that
``tc.tune_allocator()`` applies (benchmarks/_timing.py calls it; printed at the top).

    python benchmarks/engine_overhead.py [--batch 100] [--repeat 5] [--chain 20000] [--json]
"""
from __future__ import annotations

import argparse
import json
import platform

import numpy as np

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from _timing import describe_allocator, say_pytorch_missing, time_call


def chain_overhead(length: int, repeat: int) -> dict:
    x = tc.tensor(np.ones(4, np.float32), device="cpu", requires_grad=True)

    def forward():
        y = x
        for _ in range(length // 2):
            y = y * 1.0001 + 0.0001
        return y

    def forward_backward():
        forward().sum().backward()

    with tc.no_grad():
        t_nograd = time_call(forward, repeat)
    t_fwd = time_call(forward, repeat)
    t_fb = time_call(forward_backward, repeat)
    out = {"ops": length, "us_per_op_no_grad": t_nograd["median"] / length * 1e6,
           "us_per_op_forward": t_fwd["median"] / length * 1e6,
           "us_per_op_forward_backward": t_fb["median"] / length * 1e6}
    try:
        import torch
    except ImportError:
        return out
    xt = torch.ones(4, requires_grad=True)

    def torch_fb():
        y = xt
        for _ in range(length // 2):
            y = y * 1.0001 + 0.0001
        y.sum().backward()

    out["torch_us_per_op_forward_backward"] = time_call(torch_fb, repeat)["median"] / length * 1e6
    return out


def gradient_copies(batch: int = 8) -> dict:
    """Gradient arrays copied by one full CapsNet training step's backward, and gradients handed out."""
    from tinygrad_caps import autograd
    from tinygrad_caps.models import CapsNet, capsule_loss

    tc.manual_seed(0)
    model = CapsNet()
    rng = np.random.default_rng(0)
    x = tc.tensor(rng.random((batch, 1, 28, 28), dtype=np.float32))
    y = rng.integers(0, 10, batch)
    _, lengths, recon = model(x, y)
    loss = capsule_loss(lengths, recon, x, y)
    before = autograd.stats["grad_copies"]
    loss.backward()
    params = list(model.parameters())
    return {"copies": autograd.stats["grad_copies"] - before, "gradients": sum(p.grad is not None for p in params)}


def conv_case(name, x_shape, w_shape, stride, repeat) -> dict:
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal(x_shape, dtype=np.float32)
    w_np = rng.standard_normal(w_shape, dtype=np.float32) * 0.01
    b_np = np.zeros(w_shape[0], np.float32)
    x = tc.tensor(x_np, device="cpu", requires_grad=x_shape[1] > 1)
    w = tc.tensor(w_np, device="cpu", requires_grad=True)
    b = tc.tensor(b_np, device="cpu", requires_grad=True)
    y = F.conv2d(x, w, b, stride)
    g_np = rng.standard_normal(y.shape, dtype=np.float32)
    g = tc.tensor(g_np, device="cpu")
    del y

    def ours_forward():
        with tc.no_grad():
            F.conv2d(x, w, b, stride)

    def ours_step():
        x.grad = w.grad = b.grad = None
        F.conv2d(x, w, b, stride).backward(g)

    flops = 2 * np.prod(g_np.shape) * np.prod(w_shape[1:])
    result = {"case": name, "x": x_shape, "w": w_shape, "stride": stride,
              "gflop_forward": flops / 1e9,
              "ours_forward_s": time_call(ours_forward, repeat)["median"],
              "ours_forward_backward_s": time_call(ours_step, repeat)["median"]}
    try:
        import torch
    except ImportError:
        return result
    xt = torch.from_numpy(x_np).requires_grad_(x_shape[1] > 1)
    wt = torch.from_numpy(w_np).requires_grad_()
    bt = torch.from_numpy(b_np).requires_grad_()
    gt = torch.from_numpy(g_np)

    def torch_forward():
        with torch.no_grad():
            torch.nn.functional.conv2d(xt, wt, bt, stride)

    def torch_step():
        xt.grad = wt.grad = bt.grad = None
        torch.nn.functional.conv2d(xt, wt, bt, stride).backward(gt)

    result["torch_forward_s"] = time_call(torch_forward, repeat)["median"]
    result["torch_forward_backward_s"] = time_call(torch_step, repeat)["median"]
    result["ratio_forward"] = result["ours_forward_s"] / result["torch_forward_s"]
    result["ratio_forward_backward"] = result["ours_forward_backward_s"] / result["torch_forward_backward_s"]
    # sanity: both compute the same thing
    y_ours = F.conv2d(x, w, b, stride).numpy()
    with torch.no_grad():
        y_ref = torch.nn.functional.conv2d(xt, wt, bt, stride).numpy()
    result["max_abs_diff"] = float(np.abs(y_ours - y_ref).max())
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chain", type=int, default=20000)
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    args = parser.parse_args()

    info = {"machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
            "numpy": np.__version__, "allocator": describe_allocator()}
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        info["torch"] = None
    results = {"info": info, "chain": chain_overhead(args.chain, args.repeat), "conv": [
        conv_case("PrimaryCaps", (args.batch, 256, 20, 20), (256, 256, 9, 9), 2, args.repeat),
        conv_case("Conv1", (args.batch, 1, 28, 28), (256, 1, 9, 9), 1, args.repeat),
    ], "gradient_copies": gradient_copies()}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"# {info}")
    c = results["chain"]
    line = (f"op chain ({c['ops']} ops): {c['us_per_op_no_grad']:.2f} us/op no_grad, {c['us_per_op_forward']:.2f} "
            f"us/op recorded, {c['us_per_op_forward_backward']:.2f} us/op forward+backward")
    if "torch_us_per_op_forward_backward" in c:
        line += f" (PyTorch {c['torch_us_per_op_forward_backward']:.2f})"
    print(line)
    g = results["gradient_copies"]
    print(f"CapsNet step: backward copied {g['copies']} of the {g['gradients']} parameter gradients it handed out")
    with_torch = info["torch"] is not None
    if not with_torch:
        say_pytorch_missing()
    print(f"{'case':<12} {'GFLOP fwd':>9} {'ours fwd':>9}" + (f" {'torch fwd':>9} {'ratio':>6}" if with_torch else "")
          + f" {'ours f+b':>9}" + (f" {'torch f+b':>9} {'ratio':>6}" if with_torch else ""))
    for r in results["conv"]:
        forward = f"{r['ours_forward_s']:>8.3f}s"
        both = f"{r['ours_forward_backward_s']:>8.3f}s"
        if with_torch:
            forward += f" {r['torch_forward_s']:>8.3f}s {r['ratio_forward']:>6.2f}"
            both += f" {r['torch_forward_backward_s']:>8.3f}s {r['ratio_forward_backward']:>6.2f}"
        print(f"{r['case']:<12} {r['gflop_forward']:>9.1f} {forward} {both}")


if __name__ == "__main__":
    main()
