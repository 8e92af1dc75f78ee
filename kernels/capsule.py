"""Launchers for capsule.py's kernels: the DigitCaps prediction u_hat = W u and its two adjoints.

Shapes: W (I, J, D, K), u (B, I, K), u_hat and its gradient g (B, I, J, D).
"""
from __future__ import annotations

from .launch import DEFAULT_THREADS, KernelLaunch, check_int32, default_runner, empty_like_output, grid_for, i32, \
    prepare, suffix


def _sizes(op, u_shape, w_shape):
    b, i, k = u_shape
    wi, j, d, wk = w_shape
    if (wi, wk) != (i, k):
        raise ValueError(f"{op}: u of shape {tuple(u_shape)} (B, I, K) does not fit W of shape {tuple(w_shape)} (I, J, D, K)")
    check_int32(op, B=b, I=i, J=j, D=d, K=k)
    return b, i, j, d, k


def _run(op, source_kernel, inputs, out_shape, sizes, runner, threads):
    xp, arrays = inputs
    out = empty_like_output(xp, out_shape, arrays[0].dtype)
    launch = KernelLaunch("capsule.cu", f"{source_kernel}_{suffix(out.dtype)}", grid_for(out.size, threads),
                          (threads,), tuple(arrays) + (out,) + i32(*sizes), outputs=(len(arrays),))
    (runner or default_runner(arrays))(launch)
    return out


def capsule_predict(u, W, runner=None, threads: int = DEFAULT_THREADS):
    """u_hat[b,i,j,d] = sum_k W[i,j,d,k] u[b,i,k]: u (B,I,K), W (I,J,D,K) -> (B,I,J,D)."""
    prepared = prepare("capsule_predict", {"u": u, "W": W}, {"u": 3, "W": 4})
    b, i, j, d, k = sizes = _sizes("capsule_predict", prepared[1][0].shape, prepared[1][1].shape)
    return _run("capsule_predict", "capsule_predict", prepared, (b, i, j, d), sizes, runner, threads)


def capsule_grad_u(g, W, runner=None, threads: int = DEFAULT_THREADS):
    """grad_u[b,i,k] = sum_{j,d} W[i,j,d,k] g[b,i,j,d]: g (B,I,J,D), W (I,J,D,K) -> (B,I,K)."""
    prepared = prepare("capsule_grad_u", {"g": g, "W": W}, {"g": 4, "W": 4})
    g, W = prepared[1]
    if g.shape[1:] != W.shape[:3]:
        raise ValueError(f"capsule_grad_u: g of shape {tuple(g.shape)} does not fit W of shape {tuple(W.shape)}")
    b, i, j, d, k = sizes = _sizes("capsule_grad_u", (g.shape[0], W.shape[0], W.shape[3]), W.shape)
    return _run("capsule_grad_u", "capsule_grad_u", prepared, (b, i, k), sizes, runner, threads)


def capsule_grad_w(g, u, runner=None, threads: int = DEFAULT_THREADS):
    """grad_W[i,j,d,k] = sum_b g[b,i,j,d] u[b,i,k]: g (B,I,J,D), u (B,I,K) -> (I,J,D,K), deterministic."""
    prepared = prepare("capsule_grad_w", {"g": g, "u": u}, {"g": 4, "u": 3})
    g, u = prepared[1]
    if g.shape[:2] != u.shape[:2]:
        raise ValueError(f"capsule_grad_w: g of shape {tuple(g.shape)} does not fit u of shape {tuple(u.shape)}")
    b, i, j, d = g.shape
    sizes = _sizes("capsule_grad_w", u.shape, (i, j, d, u.shape[2]))
    return _run("capsule_grad_w", "capsule_grad_w", prepared, (i, j, d, u.shape[2]), sizes, runner, threads)
