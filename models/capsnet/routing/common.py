"""What the routing algorithms share: the gradient modes, the weighted sum, and the checks and
result shapes of their functions. Votes are u_hat (B, I, J, D) throughout.

The names with a leading underscore are the package's own (its algorithm modules import them);
the others are exported by the package.
"""
from __future__ import annotations

from tinygrad_caps import functional as F

# How much of the gradient flows through an iterative routing's iterations:
#     "full"    through every iteration, as the official code of dynamic routing does;
#     "detach"  through u_hat only in the last iteration; the earlier iterations, which only set the
#               coupling coefficients, see a detached u_hat (as several public implementations do).
GRADIENT_MODES = ("full", "detach")
DEFAULT_EPS = 1e-8  # the eps of EM routing's and self-routing's formulas


def weighted_sum(c, u_hat, bias=None):
    """s (B, J, D) = sum_i c (B, I, J) * u_hat (B, I, J, D), plus ``bias`` (J, D) when given."""
    s = F.routing_weighted_sum(c, u_hat)
    return s if bias is None else s + bias


def _routing_result(v, couplings, trace):
    """v, then the couplings and the trace where they were asked for."""
    extras = tuple(x for x in (couplings, trace) if x is not None)
    return (v,) + extras if extras else v


def _check_votes(name, u_hat):
    if u_hat.ndim != 4:
        raise ValueError(f"{name}: expected u_hat (B, I, J, D), got shape {u_hat.shape}")


def _check_shape(name, what, tensor, shape):
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: {what} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")


def _check_bias(name, bias, u_hat):
    if bias is not None and tuple(bias.shape) != tuple(u_hat.shape[2:]):
        raise ValueError(f"{name}: bias must have shape (J, D) = {tuple(u_hat.shape[2:])} for u_hat {u_hat.shape}, "
                         f"got {tuple(bias.shape)}")


def _identity(t, trace):
    """``t`` through an identity node of its own when tracing (a path the trace measures), else ``t``."""
    return F.identity(t) if trace else t
