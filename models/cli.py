"""The ``tinygrad-caps`` command's entry point: ``main(argv)`` (also ``python -m tinygrad_caps.models.cli``).

User errors (a bad option value, a missing, unreadable or corrupt dataset or checkpoint, a
checkpoint for another architecture, ``--device cuda`` without a GPU, an unusable ``--out``, a full
disk, a model too large for the machine) end with a one-line error and exit status 2. Anything else
is a bug: its traceback is printed with a line asking for a report (exit status 1). ``--debug``
prints tracebacks always. Ctrl-C and SIGTERM exit with 130 and 143 (``train`` saves first).
The parser and the commands are in ``app.cli`` and ``app.commands``.
"""
import sys

from .app.cli import add_model_options, main, make_parser, parse_with_preset

__all__ = ["add_model_options", "main", "make_parser", "parse_with_preset"]

if __name__ == "__main__":
    sys.exit(main())
