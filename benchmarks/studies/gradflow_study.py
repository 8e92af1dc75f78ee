"""Full vs detached routing gradient at 1 and 3 iterations: one epoch each of the README's reduced
CapsNet on a Fashion-MNIST subset, with `tinygrad-caps gradflow` at initialisation and after
training, and `--log-gradflow` during it; prints a Markdown summary.

    python benchmarks/studies/gradflow_study.py --out /tmp/gradflow-study [--train-images 3000] [--test-images 1000]
    python benchmarks/studies/gradflow_study.py --out /tmp/gradflow-study --summary-only   # tables of a finished study

At one iteration the two modes are the same computation (there is no inner iteration to detach),
so that configuration runs once.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tinygrad_caps.models import cli

MODEL = ["--conv1-channels", "64", "--primary-types", "16"]
CONFIGS = (("it1-full", 1, "full"), ("it3-full", 3, "full"), ("it3-detach", 3, "detach"))


def run(out: Path, train_images: int, test_images: int, batch_size: int) -> None:
    for name, iterations, mode in CONFIGS:
        routing = ["--routing-iterations", str(iterations), "--routing-gradient", mode]
        gradflow = ["gradflow", "--batch-size", "32", "--batches", "4", "--seed", "0"]
        assert cli.main([*gradflow, *MODEL, *routing, "--out", str(out / f"{name}-init")]) == 0
        assert cli.main(["train", *MODEL, *routing, "--epochs", "1", "--limit-train", str(train_images),
                         "--limit-test", str(test_images), "--batch-size", str(batch_size), "--seed", "0",
                         "--log-gradflow", "10", "--no-progress", "--out", str(out / f"{name}-run")]) == 0
        assert cli.main([*gradflow, "--checkpoint", str(out / f"{name}-run" / "checkpoints" / "last.npz"),
                         "--out", str(out / f"{name}-trained")]) == 0


def shares(rows):
    """Each path's gradient norm over the sum of all paths' norms, as "sum r0 / agree r0 / ... / sum rR-1"."""
    parts = []
    for row in rows:
        parts.append(row["grad_norm_sum"] or 0.0)
        if row["grad_norm_agreement"] is not None:
            parts.append(row["grad_norm_agreement"])
    total = sum(parts)
    return " / ".join(f"{p / total:.2g}" for p in parts) if total else "-"


def summary(out: Path) -> str:
    lines = ["| run | when | mode measured | loss | T-score (1 - coupling entropy) per iteration | "
             "D-score (last) | share of \\|grad u_hat\\| per path (sum r0 / agreement r0 / sum r1 / ...) | "
             "cos(full, detach) digit.weight | test accuracy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, _, _ in CONFIGS:
        metrics = [json.loads(line) for line in (out / f"{name}-run" / "metrics.jsonl").read_text().splitlines()]
        accuracy = f"{metrics[-1]['test_accuracy']:.3f}"
        for when in ("init", "trained"):
            report = json.loads((out / f"{name}-{when}" / "gradflow.json").read_text())
            cosine = report["mode_cosine"].get("digit.weight")
            for mode, result in report["modes"].items():
                rows = result["layers"][-1]["iterations"]
                t_scores = ", ".join("%.1e" % row["t_score"] for row in rows)
                cosine_text = "-" if cosine is None else "%.6f" % cosine
                lines.append(f"| {name} | {when} | {mode} | {result['loss']:.4f} | {t_scores} | "
                             f"{rows[-1]['d_score']:.3g} | {shares(rows)} | "
                             f"{cosine_text} | {accuracy if when == 'trained' else '-'} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the runs and reports")
    parser.add_argument("--train-images", type=int, default=3000)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--summary-only", action="store_true", help="only print the tables of a finished study")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.summary_only:
        run(out, args.train_images, args.test_images, args.batch_size)
    print(summary(out))


if __name__ == "__main__":
    main()
