"""Conventions study: the paper's equations against the official code's conventions, with the full
and the detached routing gradient: ``tinygrad-caps study run conventions`` on the README's reduced
CapsNet, by default one epoch over 3,000 Fashion-MNIST images per run (every option of ``study
run`` passes through).

    python benchmarks/studies/conventions_study.py --out /tmp/conventions --seeds 3
    python benchmarks/studies/conventions_study.py --out /tmp/conventions --summary-only

Writes the study folder (``study.json``, ``runs/``, ``summary.json``, ``summary.md``, ``summary.png``).
"""
import sys

from _study import REDUCED_MODEL, main

if __name__ == "__main__":
    sys.exit(main("conventions", REDUCED_MODEL + ("--limit-train", "3000", "--limit-test", "1000", "--epochs", "1")))
