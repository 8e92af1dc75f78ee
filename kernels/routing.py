"""Launchers for routing.cu: the weighted sum s = sum_i c u_hat and the agreement a = u_hat . v.

Shapes: c and a (B, I, J), u_hat (B, I, J, D), s and v (B, J, D).
"""
from __future__ import annotations

from .launch import DEFAULT_THREADS, KernelLaunch, check_int32, default_runner, empty_like_output, grid_for, i32, \
    prepare, suffix

# Must match ROUTING_TX and ROUTING_TY in routing.cu.
WEIGHTED_SUM_BLOCK = (32, 8)


def routing_weighted_sum(c, u_hat, runner=None):
    """s[b,j,d] = sum_i c[b,i,j] u_hat[b,i,j,d]: c (B,I,J), u_hat (B,I,J,D) -> (B,J,D), deterministic."""
    xp, (c, u_hat) = prepare("routing_weighted_sum", {"c": c, "u_hat": u_hat}, {"c": 3, "u_hat": 4})
    if c.shape != u_hat.shape[:3]:
        raise ValueError(f"routing_weighted_sum: c of shape {tuple(c.shape)} does not fit u_hat of shape {tuple(u_hat.shape)}")
    b, i, j, d = u_hat.shape
    check_int32("routing_weighted_sum", B=b, I=i, JD=j * d)
    if b > 65535:
        raise ValueError(f"routing_weighted_sum: batch {b} exceeds the grid's 65535 rows")
    s = empty_like_output(xp, (b, j, d), u_hat.dtype)
    tx, ty = WEIGHTED_SUM_BLOCK
    launch = KernelLaunch("routing.cu", f"routing_weighted_sum_{suffix(s.dtype)}", (-(-(j * d) // tx), b), (tx, ty),
                          (c, u_hat, s) + i32(b, i, j, d), outputs=(2,))
    (runner or default_runner([c]))(launch)
    return s


def routing_agreement(u_hat, v, runner=None, threads: int = DEFAULT_THREADS):
    """a[b,i,j] = sum_d u_hat[b,i,j,d] v[b,j,d]: u_hat (B,I,J,D), v (B,J,D) -> (B,I,J)."""
    xp, (u_hat, v) = prepare("routing_agreement", {"u_hat": u_hat, "v": v}, {"u_hat": 4, "v": 3})
    b, i, j, d = u_hat.shape
    if v.shape != (b, j, d):
        raise ValueError(f"routing_agreement: v of shape {tuple(v.shape)} does not fit u_hat of shape {tuple(u_hat.shape)}")
    check_int32("routing_agreement", B=b, I=i, J=j, D=d)
    a = empty_like_output(xp, (b, i, j), u_hat.dtype)
    launch = KernelLaunch("routing.cu", f"routing_agreement_{suffix(a.dtype)}", grid_for(a.size, threads), (threads,),
                          (u_hat, v, a) + i32(b, i, j, d), outputs=(2,))
    (runner or default_runner([u_hat]))(launch)
    return a
