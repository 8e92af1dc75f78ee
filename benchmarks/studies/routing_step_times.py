"""Each routing's training step time on this device, and the routing-algorithms study sized to a budget.

    python benchmarks/studies/routing_step_times.py --device cuda --minutes 8 --json OUT/step_times.json

For every configuration of the routing-algorithms study (``study run routing-algorithms``), trains
2 epochs of ``--probe-images`` images (``tinygrad-caps train``, the study's own code path: the CUDA
graph where the run captures one, the recipe's loss) and takes the second epoch's time per batch,
so that compiling and capturing stay out of it; prints one line per configuration, then the number
of epochs of ``--train-images`` images each of ``--seeds`` seeds of every configuration can train
within ``--minutes`` (the test pass counted as a third of a training step per test batch), at
least 1. Options after ``--`` go to every training run (e.g. the reduced model, a tiny data set).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from tinygrad_caps.models import cli
from tinygrad_caps.models.app.studies.registry import get_study

TEST_STEP_SHARE = 1 / 3  # a test batch (forward only) against a training step (forward, backward, update)


def step_seconds(config_id: str, options: dict, args, extra: list, scratch: Path) -> float:
    """Seconds per training step of configuration ``config_id`` (its study ``options``): the second of two
    epochs over ``args.probe_images`` images."""
    argv = ["train", "--out", str(scratch / config_id), "--epochs", "2", "--limit-train", str(args.probe_images),
            "--limit-test", str(args.batch_size), "--batch-size", str(args.batch_size), "--device", args.device,
            "--no-progress", *extra]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    status = cli.main(argv)
    if status != 0:
        raise RuntimeError(f"{config_id}: train exited with status {status}")
    lines = [json.loads(line) for line in (scratch / config_id / "metrics.jsonl").read_text().splitlines()]
    steps = math.ceil(args.probe_images / args.batch_size)
    return lines[-1]["seconds"] / steps


def size_study(step_times: dict, args) -> dict:
    """{"epoch_seconds": {config: s}, "epochs": E, "minutes": the plan's time}: E epochs of every
    configuration and seed within ``args.minutes`` (at least 1)."""
    train_steps = math.ceil(args.train_images / args.batch_size)
    test_steps = math.ceil(args.test_images / args.batch_size)
    epoch_seconds = {c: s * (train_steps + TEST_STEP_SHARE * test_steps) for c, s in step_times.items()}
    per_epoch = args.seeds * sum(epoch_seconds.values())
    epochs = max(1, int(args.minutes * 60 // per_epoch))
    return {"epoch_seconds": epoch_seconds, "epochs": epochs, "minutes": epochs * per_epoch / 60}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--probe-images", type=int, default=2000, help="images an epoch of each probe (default 2000)")
    parser.add_argument("--train-images", type=int, default=60000)
    parser.add_argument("--test-images", type=int, default=10000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=8.0, help="the study's budget (default 8)")
    parser.add_argument("--json", type=Path, help="also write the step times and the plan here")
    args = parser.parse_args(argv)
    if min(args.batch_size, args.probe_images, args.train_images, args.test_images, args.seeds) < 1 or args.minutes <= 0:
        parser.error("sizes, seeds and minutes must be positive")
    configs = get_study("routing-algorithms").configurations()
    times = {}
    with tempfile.TemporaryDirectory() as scratch:
        for config_id, options in configs.items():
            times[config_id] = step_seconds(config_id, options, args, extra, Path(scratch))
            print(f"{config_id}: {times[config_id] * 1e3:.1f} ms a step at B={args.batch_size} on {args.device}",
                  flush=True)
    plan = size_study(times, args)
    print(f"plan: {plan['epochs']} epoch{'s' * (plan['epochs'] != 1)} of {args.train_images} images x {args.seeds} "
          f"seeds x {len(configs)} configurations, about {plan['minutes']:.1f} minutes (budget {args.minutes:g})")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "batch_size": args.batch_size,
                                         "step_seconds": times, **plan}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
