"""The engine's error types.

Each derives from the built-in type a user would first try to catch (``ValueError`` for bad
shapes and values, ``RuntimeError`` for misuse of the graph or devices); where both readings
are natural, from both.
"""
import tokenize


class ShapeError(ValueError):
    """An op received operands whose shapes it cannot combine; the message names the op and shapes."""


# A device is unavailable, unknown, or two operands of one op live on different devices (two GPUs
# included). Defined beside the kernels, which raise it too and import nothing of the engine.
from .kernels.device import DeviceError  # noqa: E402,F401


class GraphError(RuntimeError):
    """Misuse of the tape: backward through a freed graph, a non-scalar backward without a gradient."""


class AnomalyError(RuntimeError):
    """Raised under ``detect_anomaly()`` by the first op whose forward or backward output holds NaN or Inf."""


class StateDictError(RuntimeError, KeyError, ValueError):
    """``load_state_dict`` found missing, unexpected or mis-shaped keys; the message lists each one."""

    def __str__(self):  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


# What NumPy raises for damaged bytes in a .npy header: it parses the header with Python's
# tokenizer and literal_eval, so tokenize.TokenError and SyntaxError come with the ValueErrors.
NPY_HEADER_ERRORS = (ValueError, SyntaxError, tokenize.TokenError, TypeError, KeyError)


class DistributedSetupError(RuntimeError):
    """This machine cannot form the asked-for process group: mpi4py, CuPy's NCCL or a GPU is
    missing, or a host has more ranks than GPUs for NCCL. Raised on every rank alike."""


class CheckpointError(ValueError, OSError):
    """A checkpoint file is truncated, corrupt, or not one that ``tinygrad_caps.save`` wrote."""
