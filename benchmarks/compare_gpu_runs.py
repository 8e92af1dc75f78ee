"""Compare two GPU history files (benchmarks/history/gpu/, gpu_history.py): each figure of NEW against
OLD with its ratio new/old; exits 1 where a figure regressed, that is where a time (or a ratio to
PyTorch, a memory ratio, a count of failures) grew, or a fraction (or a speed-up, a throughput) fell,
by more than 10% (``--tolerance``), 0 otherwise, and 2 when a file cannot be read. Figures of someone
else's (PyTorch's times) are reported, never flagged.

    python benchmarks/compare_gpu_runs.py OLD.json NEW.json [--tolerance 0.10] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

from gpu_history import TOLERANCE, compare, comparison_lines, read


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="the relative change beyond which a figure has regressed (default 0.10)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 0 <= args.tolerance < 1:
        print(f"compare_gpu_runs.py: --tolerance must be in [0, 1), got {args.tolerance}", file=sys.stderr)
        return 2
    try:
        old, new = read(args.old), read(args.new)
    except ValueError as exc:
        print(f"compare_gpu_runs.py: {exc}", file=sys.stderr)
        return 2
    result = compare(old, new, args.tolerance)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for line in comparison_lines(old, new, result):
            print(line)
    return 1 if result["regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
