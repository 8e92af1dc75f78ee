"""Full vs detached routing gradient at 1 and 3 iterations: ``tinygrad-caps study run
gradient-modes`` on the README's reduced CapsNet, with ``--log-gradflow`` and the cosine between
the two modes' gradients logged during training; by default one epoch over 3,000 Fashion-MNIST
images per run (every option of ``study run`` passes through).

    python benchmarks/studies/gradflow_study.py --out /tmp/gradflow-study --seeds 3
    python benchmarks/studies/gradflow_study.py --out /tmp/gradflow-study --summary-only

At one iteration the two modes are the same computation, so that configuration runs once.
Writes the study folder (``study.json``, ``runs/``, ``summary.json``, ``summary.md``, ``summary.png``).
"""
import sys

from _study import REDUCED_MODEL, main

if __name__ == "__main__":
    sys.exit(main("gradient-modes", REDUCED_MODEL + ("--limit-train", "3000", "--limit-test", "1000", "--epochs", "1",
                                                     "--log-gradflow", "10")))
