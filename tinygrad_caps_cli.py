"""The ``tinygrad-caps`` console script's entry point.

It lives outside the ``tinygrad_caps`` package so that importing it costs nothing: the package (and
NumPy) are imported inside ``main``, where a Ctrl-C during start-up ends with exit status 130 and
no traceback. Everything else is ``tinygrad_caps.models.cli.main``.
"""
import os
import signal

# OpenBLAS's idle threads spin for about 2^28 cycles after each GEMM, taking the cores that
# tinygrad-caps's own threads (im2col, col2im, large elementwise ops, Adam) need right then; a
# short spin made a CapsNet training step 1.1-1.2x faster on 2 cores. OpenBLAS reads this only
# when it loads, so it is set here, before NumPy is imported (a value you set wins;
# TINYGRAD_CAPS_MALLOC_TUNING=0 leaves it alone, like the rest of the tuning).
SHORT_BLAS_SPIN = {"OPENBLAS_THREAD_TIMEOUT": "4"}


def tune_blas_threads() -> None:
    """Set a short OpenBLAS spin wait unless the user chose one or turned the tuning off."""
    if os.environ.get("TINYGRAD_CAPS_MALLOC_TUNING", "1") != "0":
        for name, value in SHORT_BLAS_SPIN.items():
            os.environ.setdefault(name, value)


def main(argv=None) -> int:
    """Run the CLI with ``argv`` (default: the command line); returns the exit status."""
    tune_blas_threads()
    try:
        from tinygrad_caps.models.cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
