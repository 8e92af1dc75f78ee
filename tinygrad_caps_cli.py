"""The ``tinygrad-caps`` console script's entry point.

It lives outside the ``tinygrad_caps`` package so that importing it costs nothing: the package (and
NumPy) are imported inside ``main``, where a Ctrl-C during start-up ends with exit status 130 and
no traceback. Everything else is ``tinygrad_caps.models.cli.main``.
"""
import os
import signal

# OpenBLAS's idle threads spin for about 2^28 cycles after each GEMM, taking the cores that
# tinygrad-caps's own threads (im2col, col2im, large elementwise ops, Adam) need right then; a
# short spin gives those cores back. OpenBLAS reads this only when it loads, so it is set here,
# before NumPy is imported (a value you set wins; TINYGRAD_CAPS_MALLOC_TUNING=0 leaves it alone,
# like the rest of the tuning).
SHORT_BLAS_SPIN = {"OPENBLAS_THREAD_TIMEOUT": "4"}


def tune_blas_threads() -> None:
    """Set a short OpenBLAS spin wait unless the user chose one or turned the tuning off."""
    if os.environ.get("TINYGRAD_CAPS_MALLOC_TUNING", "1") != "0":
        for name, value in SHORT_BLAS_SPIN.items():
            os.environ.setdefault(name, value)


class StartUpInterrupt:
    """The SIGINT handler during start-up: raises KeyboardInterrupt, as Python's own does, and
    remembers the signal in ``received``.

    Code run while libraries are imported can swallow that KeyboardInterrupt (C code that clears
    whatever error it meets, such as an extension module's initialisation), and training would
    then run to its end as if no Ctrl-C had come. What was received is checked after the imports,
    and again by the training loop's own handler when it takes over
    (``tinygrad_caps.models.app.training.run_state``), which then stops at its first batch boundary
    (every rank together, in distributed training).
    """

    def __init__(self):
        self.received = None

    def __call__(self, signum, frame):
        self.received = signum
        raise KeyboardInterrupt


def main(argv=None) -> int:
    """Run the CLI with ``argv`` (default: the command line); returns the exit status."""
    tune_blas_threads()
    start_up = StartUpInterrupt()
    previous = signal.signal(signal.SIGINT, start_up)
    try:
        try:
            from tinygrad_caps.models.cli import main as cli_main
        except Exception:
            if start_up.received is None:
                raise
            # else the Ctrl-C broke an import on its way (NumPy reports it as an ImportError)
        if start_up.received is not None:  # a Ctrl-C during the imports, swallowed or not
            raise KeyboardInterrupt
        return cli_main(argv)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        signal.signal(signal.SIGINT, previous)
