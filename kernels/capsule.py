"""Launchers for capsule.cu: the DigitCaps prediction u_hat = W u and its adjoints.

Shapes: W (I, J, D, K), u (B, I, K), u_hat and its gradient g (B, I, J, D).
"""
from __future__ import annotations

import numpy as np

from . import tune
from .launch import DEFAULT_THREADS, MAX_SHARED_BYTES, MAX_THREADS_PER_BLOCK, KernelLaunch, aligned, block_limit, \
    check_int32, default_runner, empty_like_output, fits_shared_memory, grid_for, i32, prepare, suffix, vector_width

GRAD_THREADS = 256  # capsule_grad's default: 8 warps, so 8 rows of g staged per chunk
# Must match PREDICT_KMAX in capsule.cu: capsule_predict keeps W[i]'s columns in registers up to this K.
PREDICT_KMAX = 8
# The register capsule_predict splits B into chunks until about this many (i, chunk) blocks exist
# (several waves of an H100's 132 SMs x 8 blocks), but leaves each thread at least
# PREDICT_ROWS_PER_THREAD rows of B to amortize loading its W column group. Depends on the shapes only.
PREDICT_TILES = 4096
PREDICT_ROWS_PER_THREAD = 4


# Must match GRAD_KMAX in capsule.cu: the register capsule_grad takes K up to this.
GRAD_KMAX = 8
# Rows of g the register capsule_grad stages at a time (fewer where shared memory is short). 24 rows
# of DigitCaps' 160 floats, W[i] and u: 21.6 KB, so 10 of its 96-thread blocks (63 registers) fit
# an SM and CapsNet's 1,152 blocks one wave of an H100's 132 SMs.
GRAD_TILE_ROWS = 24


def grad_registers_plan(w_shape, dtype, vec: bool, tile_rows: int | None = None):
    """(tile_rows, pitch, threads, shared values) of the register capsule_grad for W of this shape,
    or None where it cannot run (K over GRAD_KMAX, more than 1024 threads, or shared memory)."""
    _, j, d, k = w_shape
    jd = j * d
    width = vector_width(dtype) if vec else 1
    groups = jd // width
    pitch = jd + (width if (jd // width) % 2 == 0 else 0)  # pitch / width odd: no bank conflicts
    rows = tile_rows or GRAD_TILE_ROWS
    while tile_rows is None and rows > 1 and not fits_shared_memory(rows * pitch + jd * k + rows * k, dtype):
        rows //= 2
    values = rows * pitch + jd * k + rows * k
    threads = -(-rows // 32) * 32 + -(-groups // 32) * 32
    if k > GRAD_KMAX or threads > MAX_THREADS_PER_BLOCK or not fits_shared_memory(values, dtype):
        return None
    return rows, pitch, threads, values


def predict_chunks(b: int, i: int, thread_rows: int) -> int:
    """How many chunks of B the register capsule_predict uses (blocks (i, chunk), ``thread_rows``
    rows of B at a time per block)."""
    return max(1, min(-(-PREDICT_TILES // max(i, 1)), -(-b // (PREDICT_ROWS_PER_THREAD * thread_rows))))


def _sizes(op, u_shape, w_shape):
    b, i, k = u_shape
    wi, j, d, wk = w_shape
    if (wi, wk) != (i, k):
        raise ValueError(f"{op}: u of shape {tuple(u_shape)} (B, I, K) does not fit W of shape {tuple(w_shape)} (I, J, D, K)")
    check_int32(op, B=b, I=i, J=j, D=d, K=k, BJDK=b * j * d * k)
    return b, i, j, d, k


def predict_shared_values(w_shape) -> int:
    """Shared-memory values of one capsule_predict block: W[i], J*D*K of them."""
    _, j, d, k = w_shape
    return j * d * k


def grad_shared_values(w_shape, threads: int = GRAD_THREADS) -> int:
    """Shared-memory values of one capsule_grad block: W[i] and its gradient, and per warp one
    staged row of g (J*D) and of grad_u (K)."""
    _, j, d, k = w_shape
    return 2 * j * d * k + threads // 32 * (j * d + k)


def predict_fits(w_shape, dtype) -> bool:
    """Whether capsule_predict can run for W of this shape and dtype (W[i] in shared memory)."""
    return fits_shared_memory(predict_shared_values(w_shape), dtype)


def grad_fits(w_shape, dtype, threads: int = GRAD_THREADS) -> bool:
    """Whether the one-pass capsule_grad can run for W of this shape and dtype."""
    return fits_shared_memory(grad_shared_values(w_shape, threads), dtype)


def _shared_bytes(op, values, dtype):
    if not fits_shared_memory(values, dtype):
        raise ValueError(f"{op}: needs {values * np.dtype(dtype).itemsize} bytes of shared memory ({values} values "
                         f"of {np.dtype(dtype).name}); a block may use {MAX_SHARED_BYTES}")
    return values * np.dtype(dtype).itemsize


# capsule_predict's variants (tune.KERNELS): (registers, threads)
PREDICT_VARIANTS = {"shared": (False, DEFAULT_THREADS), "registers": (True, DEFAULT_THREADS),
                    "registers-128": (True, 128), "registers-512": (True, 512)}


def capsule_predict(u, W, runner=None, threads: int | None = None, registers: bool | None = None):
    """u_hat[b,i,j,d] = sum_k W[i,j,d,k] u[b,i,k]: u (B,I,K), W (I,J,D,K) -> (B,I,J,D).

    ``registers=True`` (K <= PREDICT_KMAX): blocks (i, chunk of B), each thread holding the K
    values of one column group of W[i] in registers. ``registers=False``: one block per input
    capsule with W[i] in shared memory. Both write u_hat with vector stores when J*D allows.
    ``threads`` per block (default 256). With both left at None the variant (tune.KERNELS
    "capsule_predict") is the one measured fastest on this GPU for these shapes, or the fixed
    default (W[i] in shared memory) where nothing is measured (see tune.py)."""
    xp, (u, W) = prepare("capsule_predict", {"u": u, "W": W}, {"u": 3, "W": 4})
    b, i, j, d, k = _sizes("capsule_predict", u.shape, W.shape)
    out = empty_like_output(xp, (b, i, j, d), u.dtype, like=u)
    if out.size == 0:
        return out.reshape(b, i, j, d)
    runner = runner or default_runner([u])
    candidates = {name: (lambda run, r=r, t=t: capsule_predict(u, W, run, t, r)) for name, (r, t) in
                  PREDICT_VARIANTS.items() if (k <= PREDICT_KMAX if r else predict_fits(W.shape, u.dtype))}
    if registers is None and threads is None and candidates:
        registers, threads = PREDICT_VARIANTS[tune.choose("capsule_predict", u, (u.shape, W.shape), candidates, runner)]
    threads = threads or DEFAULT_THREADS
    vec = int((j * d) % vector_width(u.dtype) == 0 and aligned(out))
    if registers is None:
        registers = PREDICT_VARIANTS[tune.KERNELS["capsule_predict"].default][0] or not predict_fits(W.shape, u.dtype)
    if registers:
        if k > PREDICT_KMAX:
            raise ValueError(f"capsule_predict: registers=True takes K <= {PREDICT_KMAX}, got K={k}")
        groups = j * d // vector_width(u.dtype) if vec else j * d
        chunks = predict_chunks(b, i, max(1, threads // groups))
        rows_per_chunk = -(-b // chunks)
        chunks = -(-b // rows_per_chunk)  # no empty chunk
        check_int32("capsule_predict", tasks=i * chunks)
        runner(KernelLaunch("capsule.cu", f"capsule_predict_{suffix(u.dtype)}",
                            (min(i * chunks, block_limit(runner)),), (threads,),
                            (u, W, out) + i32(b, i, j, d, k, chunks, rows_per_chunk, vec), outputs=(2,)))
        return out
    shared = _shared_bytes("capsule_predict", predict_shared_values(W.shape), u.dtype)
    runner(KernelLaunch("capsule.cu", f"capsule_predict_shared_{suffix(u.dtype)}", (min(i, block_limit(runner)),), (threads,),
                        (u, W, out) + i32(b, i, j, d, k, vec), outputs=(2,), shared_mem=shared))
    return out


def capsule_grad(g, u, W, runner=None, threads: int | None = None, registers: bool | None = None,
                 tile_rows: int | None = None):
    """Both adjoints of the prediction: (grad_u (B,I,K), grad_W (I,J,D,K)).

    g (B,I,J,D), u (B,I,K), W (I,J,D,K). One block per input capsule, fixed-order loops over b:
    deterministic. ``registers=True`` (where :func:`grad_registers_plan` allows, K <= GRAD_KMAX):
    one pass over g in tiles of ``tile_rows`` rows in shared memory, grad_u's and grad_W's sums in
    registers (capsule.cu: grad_registers; its block size follows from the shapes). ``registers=False``:
    one pass with W[i] and its gradient in shared memory, ``threads`` per block (default GRAD_THREADS).
    With ``registers``, ``threads`` and ``tile_rows`` left at None the variant (tune.KERNELS
    "capsule_grad": one pass in registers, split into capsule_grad_u and capsule_grad_w, or one pass
    in shared memory) is the one measured fastest on this GPU for these shapes, or the fixed
    default (one pass in registers where it can run) where nothing is measured (see tune.py)."""
    xp, (g, u, W) = prepare("capsule_grad", {"g": g, "u": u, "W": W}, {"g": 4, "u": 3, "W": 4})
    b, i, j, d, k = _sizes("capsule_grad", u.shape, W.shape)
    if g.shape != (b, i, j, d):
        raise ValueError(f"capsule_grad: g of shape {tuple(g.shape)} does not fit u {tuple(u.shape)} and W {tuple(W.shape)}")
    if threads is not None and threads % 32:
        raise ValueError(f"capsule_grad: threads must be a multiple of 32 (whole warps), got {threads}")
    if registers is None and threads is None and tile_rows is None and b and g.size and W.size:
        runner = runner or default_runner([g])
        vec = bool((j * d) % vector_width(u.dtype) == 0 and aligned(g))
        candidates = {"split": lambda run: (capsule_grad_u(g, W, run), capsule_grad_w(g, u, run))}
        if grad_registers_plan(W.shape, u.dtype, vec) or grad_registers_plan(W.shape, u.dtype, False):
            candidates["one-pass"] = lambda run: capsule_grad(g, u, W, run, registers=True)
        if grad_fits(W.shape, u.dtype):
            candidates["shared"] = lambda run: capsule_grad(g, u, W, run, GRAD_THREADS, registers=False)
        variant = tune.choose("capsule_grad", g, (u.shape, W.shape), candidates, runner)
        if variant == "split":
            return capsule_grad_u(g, W, runner), capsule_grad_w(g, u, runner)
        registers = variant == "one-pass"
    threads = threads or GRAD_THREADS
    grad_u = empty_like_output(xp, u.shape, u.dtype, like=u)
    grad_w = empty_like_output(xp, W.shape, u.dtype, like=u)
    if grad_w.size == 0 or b == 0:
        grad_u[...] = 0
        grad_w[...] = 0
        return grad_u, grad_w
    runner = runner or default_runner([g])
    vec = bool((j * d) % vector_width(u.dtype) == 0 and aligned(g))
    plan = None
    if registers is not False:
        plan = grad_registers_plan(W.shape, u.dtype, vec, tile_rows)
        if plan is None and vec:
            vec, plan = False, grad_registers_plan(W.shape, u.dtype, False, tile_rows)
        if plan is None and registers:
            raise ValueError(f"capsule_grad: registers=True needs K <= {GRAD_KMAX} and J*D = {j * d} columns that "
                             f"fit a block, got K={k}")
    if plan is not None:
        rows, pitch, block, values = plan
        runner(KernelLaunch("capsule.cu", f"capsule_grad_{suffix(u.dtype)}", (min(i, block_limit(runner)),),
                            (block,), (g, u, W, grad_u, grad_w) + i32(b, i, j, d, k, rows, pitch, vec), outputs=(3, 4),
                            shared_mem=values * u.itemsize))
        return grad_u, grad_w
    shared = _shared_bytes("capsule_grad", grad_shared_values(W.shape, threads), u.dtype)
    runner(KernelLaunch("capsule.cu", f"capsule_grad_shared_{suffix(u.dtype)}", (min(i, block_limit(runner)),),
                        (threads,), (g, u, W, grad_u, grad_w) + i32(b, i, j, d, k), outputs=(3, 4), shared_mem=shared))
    return grad_u, grad_w


def capsule_grad_u(g, W, runner=None, threads: int = DEFAULT_THREADS):
    """grad_u[b,i,k] = sum_{j,d} W[i,j,d,k] g[b,i,j,d]: g (B,I,J,D), W (I,J,D,K) -> (B,I,K)."""
    xp, (g, W) = prepare("capsule_grad_u", {"g": g, "W": W}, {"g": 4, "W": 4})
    if g.shape[1:] != W.shape[:3]:
        raise ValueError(f"capsule_grad_u: g of shape {tuple(g.shape)} does not fit W of shape {tuple(W.shape)}")
    b, i, j, d, k = sizes = _sizes("capsule_grad_u", (g.shape[0], W.shape[0], W.shape[3]), W.shape)
    out = empty_like_output(xp, (b, i, k), g.dtype, like=g)
    if out.size:
        runner = runner or default_runner([g])
        runner(KernelLaunch("capsule.cu", f"capsule_grad_u_{suffix(g.dtype)}", grid_for(out.size, threads, runner),
                            (threads,), (g, W, out) + i32(*sizes), outputs=(2,)))
    return out


def capsule_grad_w(g, u, runner=None, threads: int = DEFAULT_THREADS):
    """grad_W[i,j,d,k] = sum_b g[b,i,j,d] u[b,i,k]: g (B,I,J,D), u (B,I,K) -> (I,J,D,K), deterministic."""
    xp, (g, u) = prepare("capsule_grad_w", {"g": g, "u": u}, {"g": 4, "u": 3})
    if g.shape[:2] != u.shape[:2]:
        raise ValueError(f"capsule_grad_w: g of shape {tuple(g.shape)} does not fit u of shape {tuple(u.shape)}")
    b, i, j, d = g.shape
    sizes = _sizes("capsule_grad_w", u.shape, (i, j, d, u.shape[2]))
    out = empty_like_output(xp, (i, j, d, u.shape[2]), g.dtype, like=g)
    if out.size:
        runner = runner or default_runner([g])
        runner(KernelLaunch("capsule.cu", f"capsule_grad_w_{suffix(g.dtype)}", grid_for(out.size, threads, runner),
                            (threads,), (g, u, out) + i32(*sizes), outputs=(2,)))
    return out
