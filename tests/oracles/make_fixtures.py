"""Writes tests/oracles/fixtures.npz from PyTorch (float64), so the oracle checks run without PyTorch.

    python tests/oracles/make_fixtures.py            # rewrite the file
    python tests/oracles/make_fixtures.py --check    # regenerate in memory, compare with the stored file

Contents (all float64; "meta" is a JSON string describing the rest):
- a small CapsNet written directly in PyTorch (the paper's Procedure 1, margin and reconstruction
  loss with the default weights): its parameters, the input batch, and for each routing case
  (iterations, gradient mode) v, lengths, reconstruction, loss and every parameter's gradient;
- each optimizer configuration's trajectory over 5 steps on a fixed gradient field;
- each scheduler's learning rate over 12 epochs (with a metric sequence for ReduceLROnPlateau).
Nothing here imports tinygrad_caps: the file is PyTorch's answer, independent of the engine.
"""
import argparse
import json
import pathlib
import sys

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # torch_reference.py lies beside this file
from torch_reference import torch_capsnet as reference_capsnet  # noqa: E402
FIXTURES = HERE / "fixtures.npz"

# The CapsNet: CapsNet(**CAPSNET_CONFIG) with its decoder replaced by FCDecoder(24, 144, hidden=(8, 12)).
CAPSNET_CONFIG = dict(in_channels=1, image_size=12, num_classes=4, conv1_channels=6, primary_types=2,
                      primary_dim=4, digit_dim=6, kernel_size=3)
DECODER_HIDDEN = (8, 12)
ROUTING_CASES = [(1, "full"), (3, "full"), (3, "detach")]
LABELS = [2, 0, 2]

OPTIMIZER_STEPS = 5
START = [0.3, -1.2, 2.0]
OPTIMIZER_CONFIGS = [
    ("SGD", dict(lr=0.05)),
    ("SGD", dict(lr=0.05, weight_decay=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.3)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.05)),
    ("Adam", dict(lr=0.1)),
    ("Adam", dict(lr=0.1, betas=(0.8, 0.9), eps=1e-3)),
    ("Adam", dict(lr=0.1, weight_decay=0.2)),
    ("Adam", dict(lr=0.1, betas=(0.9, 0.6), amsgrad=True)),
    ("Adam", dict(lr=0.1, betas=(0.9, 0.6), weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=0.1)),
    ("AdamW", dict(lr=0.1, weight_decay=0.3)),
    ("AdamW", dict(lr=0.1, betas=(0.9, 0.6), weight_decay=0.3, amsgrad=True)),
]

METRICS = [1.0, 0.9, 0.95, 0.96, 0.97, 0.97, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6]
SCHEDULER_CONFIGS = [
    ("ExponentialLR", dict(gamma=0.9)),
    ("StepLR", dict(step_size=3, gamma=0.5)),
    ("StepLR", dict(step_size=2)),
    ("ReduceLROnPlateau", dict()),
    ("ReduceLROnPlateau", dict(factor=0.5, patience=2, cooldown=1)),
    ("ReduceLROnPlateau", dict(mode="max", factor=0.5, patience=1)),
    ("ReduceLROnPlateau", dict(factor=0.5, patience=0, threshold=0.1, threshold_mode="abs", min_lr=0.3)),
]


def gradient_field(p):
    """The gradient every optimizer trajectory follows: a quadratic bowl plus a ripple (numbers or arrays)."""
    return 2.0 * (p - 1.5) + 0.3 * np.sin(3 * p)


def capsnet_parameters(rng):
    """name -> float64 array, PyTorch's shapes for the CapsNet above."""
    c = CAPSNET_CONFIG
    k, ch, types, pdim = c["kernel_size"], c["conv1_channels"], c["primary_types"], c["primary_dim"]
    conv1_size = c["image_size"] - k + 1
    primary_size = (conv1_size - k) // 2 + 1
    num_primary = types * primary_size * primary_size
    pixels = c["in_channels"] * c["image_size"] ** 2
    shapes = {
        "conv1.weight": (ch, c["in_channels"], k, k), "conv1.bias": (ch,),
        "primary.weight": (types * pdim, ch, k, k), "primary.bias": (types * pdim,),
        "digit.weight": (num_primary, c["num_classes"], c["digit_dim"], pdim),
        "decoder.fc1.weight": (DECODER_HIDDEN[0], c["num_classes"] * c["digit_dim"]),
        "decoder.fc1.bias": (DECODER_HIDDEN[0],),
        "decoder.fc2.weight": (DECODER_HIDDEN[1], DECODER_HIDDEN[0]), "decoder.fc2.bias": (DECODER_HIDDEN[1],),
        "decoder.fc3.weight": (pixels, DECODER_HIDDEN[1]), "decoder.fc3.bias": (pixels,),
    }
    params = {}
    for name, shape in shapes.items():
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        scale = 0.3 if name == "digit.weight" else 1.0 / np.sqrt(fan_in)
        params[name] = rng.standard_normal(shape) * scale
    return params


def torch_capsnet(p, x, y, iterations, gradient):
    """The paper's CapsNet in PyTorch (tests/oracles/torch_reference.py): v, lengths, reconstruction, loss."""
    return reference_capsnet(torch, p, x, y, iterations, gradient, CAPSNET_CONFIG["primary_types"],
                             CAPSNET_CONFIG["primary_dim"])


def capsnet_fixtures():
    rng = np.random.default_rng(2017)
    params = capsnet_parameters(rng)
    c = CAPSNET_CONFIG
    x = rng.random((len(LABELS), c["in_channels"], c["image_size"], c["image_size"]))
    out = {"capsnet/x": x, "capsnet/y": np.array(LABELS, dtype=np.int64)}
    out.update({f"capsnet/param/{k}": v for k, v in params.items()})
    for iterations, gradient in ROUTING_CASES:
        tensors = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
        v, lengths, recon, loss = torch_capsnet(tensors, torch.tensor(x), torch.tensor(LABELS), iterations, gradient)
        loss.backward()
        case = f"capsnet/{iterations}-{gradient}"
        out[f"{case}/v"] = v.detach().numpy()
        out[f"{case}/lengths"] = lengths.detach().numpy()
        out[f"{case}/reconstruction"] = recon.detach().numpy()
        out[f"{case}/loss"] = loss.detach().numpy()
        out.update({f"{case}/grad/{k}": t.grad.numpy() for k, t in tensors.items()})
    return out


def optimizer_fixtures():
    out = {}
    for index, (name, kwargs) in enumerate(OPTIMIZER_CONFIGS):
        p = torch.tensor(START, dtype=torch.float64, requires_grad=True)
        opt = getattr(torch.optim, name)([p], **kwargs)
        path = [p.detach().numpy().copy()]
        for _ in range(OPTIMIZER_STEPS):
            p.grad = torch.from_numpy(gradient_field(p.detach().numpy()))
            opt.step()
            path.append(p.detach().numpy().copy())
        out[f"optimizer/{index}"] = np.stack(path)
    return out


def scheduler_fixtures():
    out = {}
    for index, (name, kwargs) in enumerate(SCHEDULER_CONFIGS):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        sched = getattr(torch.optim.lr_scheduler, name)(opt, **kwargs)
        lrs = []
        for metric in METRICS:
            opt.step()
            sched.step(metric) if name == "ReduceLROnPlateau" else sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        out[f"scheduler/{index}"] = np.array(lrs)
    return out


def make():
    torch.manual_seed(0)
    meta = dict(capsnet_config=CAPSNET_CONFIG, decoder_hidden=DECODER_HIDDEN, routing_cases=ROUTING_CASES,
                optimizer_steps=OPTIMIZER_STEPS, start=START, optimizers=OPTIMIZER_CONFIGS,
                metrics=METRICS, schedulers=SCHEDULER_CONFIGS, torch_version=torch.__version__.split("+")[0])
    out = {"meta": np.array(json.dumps(meta))}
    out.update(capsnet_fixtures())
    out.update(optimizer_fixtures())
    out.update(scheduler_fixtures())
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    args = parser.parse_args(argv)
    fresh = make()
    if not args.check:
        np.savez_compressed(FIXTURES, **fresh)
        print(f"wrote {FIXTURES.name}: {len(fresh)} arrays")
        return 0
    stored = np.load(FIXTURES)
    bad = sorted(set(stored.files) ^ set(fresh))
    for key in sorted(set(stored.files) & set(fresh)):
        a, b = stored[key], fresh[key]
        same = a.shape == b.shape and (np.array_equal(a, b) if a.dtype.kind in "iuU" else np.allclose(a, b, rtol=1e-12, atol=1e-15))
        if not same:
            bad.append(key)
    print("fixtures reproduced" if not bad else f"fixtures differ in {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
