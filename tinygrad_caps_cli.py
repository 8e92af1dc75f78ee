"""The ``tinygrad-caps`` console script's entry point.

It lives outside the ``tinygrad_caps`` package so that importing it costs nothing: the package (and
NumPy) are imported inside ``main``, where a Ctrl-C during start-up ends with exit status 130 and
no traceback. Everything else is ``tinygrad_caps.models.cli.main``.
"""
import signal


def main(argv=None) -> int:
    """Run the CLI with ``argv`` (default: the command line); returns the exit status."""
    try:
        from tinygrad_caps.models.cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
