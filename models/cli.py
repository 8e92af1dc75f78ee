"""The ``tinygrad-caps`` command's entry point: ``main(argv)`` (also ``python -m tinygrad_caps.models.cli``).

User errors (a bad option value, a missing, unreadable or corrupt dataset or checkpoint, a
checkpoint for another architecture, ``--device cuda`` without a GPU, an unusable ``--out``, a full
disk, a model too large for the machine) end with a one-line error and exit status 2. Anything else
is a bug: its traceback is printed with a line asking for a report (exit status 1). ``--debug``
prints tracebacks always. Ctrl-C and SIGTERM exit with 130 and 143 (``train`` saves first).
The parser and one module per command are in ``app.cli``.
"""
import sys

from .app.cli.model_options import add_model_options
from .app.cli.parser import main, make_parser, parse_with_preset

__all__ = ["add_model_options", "main", "make_parser", "parse_with_preset"]

if __name__ == "__main__":
    sys.exit(main())
