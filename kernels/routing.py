"""Launchers for routing.cu: the weighted sum s = sum_i c u_hat, the agreement a = u_hat . v,
the sum of outer products that is u_hat's gradient through both, and the forward-only fused routing.

Shapes: c and a (B, I, J), u_hat (B, I, J, D), s and v (B, J, D).
"""
from __future__ import annotations

from .launch import DEFAULT_THREADS, MAX_BLOCKS, MAX_SHARED_BYTES, KernelLaunch, aligned, block_limit, check_int32, \
    default_runner, empty_like_output, fits_shared_memory, grid_for, i32, prepare, suffix, vector_width

# Must match AGREEMENT_ROWS_PER_WARP in routing.cu.
AGREEMENT_ROWS_PER_WARP = 4
# The weighted sum splits I into chunks until about this many tiles (blocks) exist: enough to
# fill an H100's 132 SMs several times over. Depends on B and I only, so results do too.
WEIGHTED_SUM_TILES = 2048
# Must match ROUTING_FORWARD_THREADS in routing.cu: the fused forward's block size and its
# __launch_bounds__, so at most this many threads per block.
FORWARD_THREADS = 1024


def weighted_sum_chunks(b: int, i: int) -> int:
    """How many chunks of I the weighted sum's first pass uses for a batch of ``b``."""
    return max(1, min(i, -(-WEIGHTED_SUM_TILES // max(b, 1))))


def routing_weighted_sum(c, u_hat, runner=None, threads: int = DEFAULT_THREADS):
    """s[b,j,d] = sum_i c[b,i,j] u_hat[b,i,j,d]: c (B,I,J), u_hat (B,I,J,D) -> (B,J,D), deterministic.

    Two launches: partial sums per (b, chunk of I) tile, then the chunks added in order."""
    xp, (c, u_hat) = prepare("routing_weighted_sum", {"c": c, "u_hat": u_hat}, {"c": 3, "u_hat": 4})
    if c.shape != u_hat.shape[:3]:
        raise ValueError(f"routing_weighted_sum: c of shape {tuple(c.shape)} does not fit u_hat of shape {tuple(u_hat.shape)}")
    b, i, j, d = u_hat.shape
    check_int32("routing_weighted_sum", B=b, I=i, JD=j * d, BIJD=u_hat.size)
    s = empty_like_output(xp, (b, j, d), u_hat.dtype, like=u_hat)
    if s.size == 0:
        return s
    if i == 0:
        s[...] = 0
        return s
    runner = runner or default_runner([c])
    chunks = weighted_sum_chunks(b, i)
    rows_per_chunk = -(-i // chunks)
    chunks = -(-i // rows_per_chunk)  # no empty chunk
    partial = empty_like_output(xp, (b, chunks, j * d), u_hat.dtype, like=u_hat)
    width = vector_width(u_hat.dtype)
    vec = int(d % width == 0 and aligned(u_hat) and aligned(partial))
    groups = j * d // width if vec else j * d
    rows = max(1, threads // groups)
    shared = rows * groups * (width if vec else 1) * u_hat.itemsize if rows > 1 else 0
    if shared > MAX_SHARED_BYTES:
        raise ValueError(f"routing_weighted_sum: {threads} threads need {shared} bytes of shared memory")
    runner(KernelLaunch("routing.cu", f"routing_weighted_sum_partial_{suffix(s.dtype)}",
                        (min(b * chunks, block_limit(runner)),), (threads,),
                        (c, u_hat, partial) + i32(b, i, j, d, chunks, rows_per_chunk, vec), outputs=(2,),
                        shared_mem=shared))
    runner(KernelLaunch("routing.cu", f"routing_weighted_sum_finish_{suffix(s.dtype)}",
                        grid_for(s.size, threads, runner), (threads,), (partial, s) + i32(b, j * d, chunks),
                        outputs=(1,)))
    return s


def agreement_fits(u_hat_shape, dtype) -> bool:
    """Whether routing_agreement can run for u_hat of this shape and dtype (v[b], J*D values, in
    its block's shared memory)."""
    _, _, j, d = u_hat_shape
    return fits_shared_memory(j * d, dtype)


def routing_agreement(u_hat, v, runner=None, threads: int = DEFAULT_THREADS):
    """a[b,i,j] = sum_d u_hat[b,i,j,d] v[b,j,d]: u_hat (B,I,J,D), v (B,J,D) -> (B,I,J).

    One warp per (b, i) row, v[b] in shared memory, a shuffle reduction per j."""
    xp, (u_hat, v) = prepare("routing_agreement", {"u_hat": u_hat, "v": v}, {"u_hat": 4, "v": 3})
    b, i, j, d = u_hat.shape
    if v.shape != (b, j, d):
        raise ValueError(f"routing_agreement: v of shape {tuple(v.shape)} does not fit u_hat of shape {tuple(u_hat.shape)}")
    check_int32("routing_agreement", B=b, I=i, J=j, D=d, BIJD=u_hat.size)
    if threads % 32:
        raise ValueError(f"routing_agreement: threads must be a multiple of 32 (whole warps), got {threads}")
    a = empty_like_output(xp, (b, i, j), u_hat.dtype, like=u_hat)
    if a.size == 0:
        return a
    if d == 0:
        a[...] = 0
        return a
    runner = runner or default_runner([u_hat])
    width = vector_width(u_hat.dtype)
    group = d // width
    vec = int(d % width == 0 and group <= 32 and group & (group - 1) == 0 and aligned(u_hat))
    if not agreement_fits(u_hat.shape, u_hat.dtype):
        raise ValueError(f"routing_agreement: v[b] of J*D = {j * d} values does not fit shared memory")
    shared = j * d * u_hat.itemsize
    tiles = b * -(-i // (threads // 32 * AGREEMENT_ROWS_PER_WARP))
    runner(KernelLaunch("routing.cu", f"routing_agreement_{suffix(a.dtype)}", (min(tiles, block_limit(runner)),),
                        (threads,), (u_hat, v, a) + i32(b, i, j, d, vec), outputs=(2,), shared_mem=shared))
    return a


def routing_outer_products(p, q, runner=None, threads: int = DEFAULT_THREADS, wide_indices: bool | None = None):
    """g[b,i,j,d] = sum_t p[t,b,i,j] q[t,b,j,d]: p (T,B,I,J), q (T,B,J,D) -> (B,I,J,D), the terms
    added in order t. Routing's u_hat gradient from T weighted sums and agreements, in one pass.
    ``wide_indices``: force 64-bit (True) or 32-bit index math (None: 64-bit only where needed)."""
    xp, (p, q) = prepare("routing_outer_products", {"p": p, "q": q}, {"p": 4, "q": 4})
    terms, b, i, j = p.shape
    d = q.shape[3]
    if q.shape[:3] != (terms, b, j):
        raise ValueError(f"routing_outer_products: q of shape {tuple(q.shape)} does not fit p of shape {tuple(p.shape)}")
    check_int32("routing_outer_products", T=terms, B=b, I=i, J=j, D=d)
    out = empty_like_output(xp, (b, i, j, d), p.dtype, like=p)
    if out.size == 0:
        return out
    if terms == 0:
        out[...] = 0
        return out
    runner = runner or default_runner([p])
    # 64-bit indices only where some index (every term's p, or the grid-stride step) passes int32
    wide = int(max(p.size, q.size, out.size) + threads * MAX_BLOCKS >= 2 ** 31)
    runner(KernelLaunch("routing.cu", f"routing_outer_products_{suffix(p.dtype)}", grid_for(out.size, threads, runner),
                        (threads,), (p, q, out) + i32(terms, b, i, j, d, wide if wide_indices is None else wide_indices),
                        outputs=(2,)))
    return out


def forward_shared_values(j: int, d: int, threads: int = FORWARD_THREADS) -> int:
    """Shared-memory values of one routing_forward block: v[b] (J*D) and the J*D partial sums of
    each of its thread rows."""
    return (1 + max(1, threads // (j * d))) * j * d


def forward_fits(u_hat_shape, dtype, threads: int = FORWARD_THREADS) -> bool:
    """Whether routing_forward can run for u_hat of this shape and dtype (its block's shared memory)."""
    _, _, j, d = u_hat_shape
    return j * d > 0 and fits_shared_memory(forward_shared_values(j, d, threads), dtype)


def routing_forward(u_hat, iterations: int, eps: float = 1e-8, runner=None, threads: int = FORWARD_THREADS):
    """Dynamic routing without a gradient, all iterations in one launch (one block per example).

    Computes, from logits b = 0, ``iterations`` times: c = softmax_J(b); s = sum_i c u_hat;
    v = squash(s, eps); and, but for the last time, b += u_hat . v. u_hat (B,I,J,D) ->
    (v (B,J,D), c (B,I,J) of the last iteration, b (B,I,J) of the last iteration)."""
    xp, (u_hat,) = prepare("routing_forward", {"u_hat": u_hat}, {"u_hat": 4})
    if iterations < 1:
        raise ValueError(f"routing_forward: iterations must be >= 1, got {iterations}")
    b, i, j, d = u_hat.shape
    check_int32("routing_forward", B=b, I=i, J=j, D=d, BIJD=u_hat.size, IJ=i * j)
    if min(b, i, j, d) == 0:
        raise ValueError(f"routing_forward: u_hat of shape {tuple(u_hat.shape)} has an empty axis")
    v = empty_like_output(xp, (b, j, d), u_hat.dtype, like=u_hat)
    c = empty_like_output(xp, (b, i, j), u_hat.dtype, like=u_hat)
    logits = empty_like_output(xp, (b, i, j), u_hat.dtype, like=u_hat)
    runner = runner or default_runner([u_hat])
    if not 1 <= threads <= FORWARD_THREADS:
        raise ValueError(f"routing_forward: threads must be from 1 to {FORWARD_THREADS} (the kernel's launch "
                         f"bounds), got {threads}")
    if not forward_fits(u_hat.shape, u_hat.dtype, threads):
        raise ValueError(f"routing_forward: J*D = {j * d} values per example do not fit shared memory with "
                         f"{threads} threads")
    shared = forward_shared_values(j, d, threads) * u_hat.itemsize
    eps_scalar = u_hat.dtype.type(eps)
    runner(KernelLaunch("routing.cu", f"routing_forward_{suffix(u_hat.dtype)}", (min(b, block_limit(runner)),),
                        (threads,), (u_hat, v, c, logits) + i32(b, i, j, d, iterations) + (eps_scalar,),
                        outputs=(1, 2, 3), shared_mem=shared))
    return v, c, logits
