"""The ``tinygrad-caps`` command line: ``parser`` builds the parser from one module per command and
dispatches to it; each command module has ``add_arguments(parser)`` and ``run(args)``."""
from .parser import COMMANDS, main, make_parser, parse_with_preset

__all__ = ["COMMANDS", "main", "make_parser", "parse_with_preset"]
