"""Depth study: 0 to K hidden capsule layers of (32, 12) (Peer, Stabinger & Rodriguez-Sanchez
2019), without and with capsule bias, with our initialisation and squash and with Peer et al.'s
settings: ``tinygrad-caps study run depth`` on the README's reduced CapsNet, by default one epoch
over 3,000 Fashion-MNIST images per run (every option of ``study run`` passes through).

    python benchmarks/studies/depth_study.py --out /tmp/depth --max-depth 2 --seeds 3
    python benchmarks/studies/depth_study.py --out /tmp/depth --summary-only   # the tables again

Writes the study folder (``study.json``, ``runs/``, ``summary.json``, ``summary.md``, ``summary.png``).
"""
import sys

from _study import REDUCED_MODEL, main

if __name__ == "__main__":
    sys.exit(main("depth", REDUCED_MODEL + ("--limit-train", "3000", "--limit-test", "1000", "--epochs", "1",
                                            "--log-gradflow", "10")))
