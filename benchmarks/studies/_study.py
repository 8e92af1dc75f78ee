"""What the study scripts share: each is ``tinygrad-caps study run NAME`` with the README's reduced
model and the script's budget as defaults, and every option given passed on (``--summary-only``
prints the summary of the study in ``--out`` instead of running it)."""
from __future__ import annotations

import sys

from tinygrad_caps.models import cli

REDUCED_MODEL = ("--conv1-channels", "64", "--primary-types", "16")


def main(name: str, defaults: tuple, argv=None) -> int:
    """Run study ``name`` with ``argv`` (default: the command line), ``defaults`` (flag, value, ...)
    filling the options it does not give; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--summary-only" in argv:
        argv.remove("--summary-only")
        out = argv[argv.index("--out") + 1] if "--out" in argv else None
        if out is None:
            print("--summary-only needs --out DIR, the study's folder", file=sys.stderr)
            return 2
        return cli.main(["study", "summary", out])
    given = {arg.split("=")[0] for arg in argv if arg.startswith("--")}
    pairs = list(zip(defaults[::2], defaults[1::2]))
    filled = [part for flag, value in pairs if flag not in given for part in (flag, value)]
    return cli.main(["study", "run", name, *filled, *argv])
