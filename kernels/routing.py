"""Launchers for routing.cu: the weighted sum s = sum_i c u_hat, the agreement a = u_hat . v,
the sum of outer products that is u_hat's gradient through both, and the forward-only fused routing.

Shapes: c and a (B, I, J), u_hat (B, I, J, D), s and v (B, J, D).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import tune
from .device import multiprocessor_count, on_device_of
from .launch import DEFAULT_THREADS, MAX_BLOCKS, MAX_SHARED_BYTES, KernelLaunch, aligned, block_limit, check_int32, \
    default_runner, empty_like_output, fits_shared_memory, grid_for, i32, prepare, suffix, vector_width

# Must match AGREEMENT_ROWS_PER_WARP in routing.cu (the agreement's scalar path).
AGREEMENT_ROWS_PER_WARP = 4
# The agreement's vector path gives each block tiles of about this many vectors per thread.
AGREEMENT_VECTORS_PER_THREAD = 8
# The weighted sum splits I into chunks until about this many tiles (blocks) exist: enough to
# fill an H100's 132 SMs several times over. Depends on B and I only, so results do too.
WEIGHTED_SUM_TILES = 2048
# Must match ROUTING_FORWARD_THREADS in routing.cu: the fused forward's block size and the
# __launch_bounds__ of both its kernels, so at most this many threads per block.
FORWARD_THREADS = 1024
# The sliced fused forward (routing_forward_sliced_* in routing.cu; see routing_forward):
FORWARD_SLICED_THREADS = 256   # its default block size: 8 such blocks fill an SM's 2048 threads
FORWARD_BLOCKS_PER_SM = 8      # the (example, slice) blocks it aims at per SM, one wave (32 registers,
                               # at most FORWARD_TILE_BYTES of shared memory: 8 fit an SM)
FORWARD_MIN_SLICE_ROWS = 32    # no slice shorter: its partial sums (J*D) stay at most 1/32 of its reads
FORWARD_TILE_BYTES = 24 * 1024  # the shared memory a block stages rows in (8 blocks fit an SM's 228 KiB)
FORWARD_SINGLE_BLOCK_BYTES = 64 * 1024  # an example's u_hat up to this, with one slice: the one-launch kernel
FORWARD_DEFAULT_SMS = 132      # the SM count assumed for NumPy arrays (the CPU emulation): an H100's
SINGLE_BLOCK = 0               # routing_forward(slices=SINGLE_BLOCK): one block per example, one launch


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


AGREEMENT_VARIANTS = {"threads-256": 256, "threads-128": 128, "threads-512": 512}  # tune.KERNELS' block sizes


def routing_agreement(u_hat, v, runner=None, threads: int | None = None):
    """a[b,i,j] = sum_d u_hat[b,i,j,d] v[b,j,d]: u_hat (B,I,J,D), v (B,J,D) -> (B,I,J).

    Tiles of rows of one example, v[b] in shared memory. Vector path (D a multiple of 4 floats or
    2 doubles, D/4 or D/2 a power of two up to 32, u_hat aligned): the tile's vectors as one flat
    run, 32 neighbouring vectors per warp step, shuffles within each (i, j). Else one warp per
    (b, i) row, a shuffle reduction per j. ``threads`` per block; None: the block size measured
    fastest on this GPU for these shapes (tune.KERNELS "routing_agreement"), else 256."""
    xp, (u_hat, v) = prepare("routing_agreement", {"u_hat": u_hat, "v": v}, {"u_hat": 4, "v": 3})
    b, i, j, d = u_hat.shape
    if v.shape != (b, j, d):
        raise ValueError(f"routing_agreement: v of shape {tuple(v.shape)} does not fit u_hat of shape {tuple(u_hat.shape)}")
    check_int32("routing_agreement", B=b, I=i, J=j, D=d, BIJD=u_hat.size)
    if threads is None:
        if u_hat.size and d and agreement_fits(u_hat.shape, u_hat.dtype):
            candidates = {name: (lambda run, t=t: routing_agreement(u_hat, v, run, t))
                          for name, t in AGREEMENT_VARIANTS.items()}
            threads = AGREEMENT_VARIANTS[tune.choose("routing_agreement", u_hat, (u_hat.shape,), candidates,
                                                     runner or default_runner([u_hat]))]
        else:
            threads = DEFAULT_THREADS
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
    # vec: tiles of about AGREEMENT_VECTORS_PER_THREAD vectors per thread; else a warp per row, 4 rows each
    rows_per_tile = max(1, threads * AGREEMENT_VECTORS_PER_THREAD // (j * group)) if vec else \
        threads // 32 * AGREEMENT_ROWS_PER_WARP
    tiles = b * -(-i // rows_per_tile)
    runner(KernelLaunch("routing.cu", f"routing_agreement_{suffix(a.dtype)}", (min(tiles, block_limit(runner)),),
                        (threads,), (u_hat, v, a) + i32(b, i, j, d, vec, rows_per_tile), outputs=(2,), shared_mem=shared))
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
    """Shared-memory values of one block of the one-block-per-example routing_forward: v[b] (J*D)
    and the J*D partial sums of each of its thread rows."""
    return (1 + max(1, threads // (j * d))) * j * d


def forward_slices(b: int, i: int, sm_count: int) -> int:
    """How many slices of I the sliced forward gives each example of a batch of ``b``: as many
    (example, slice) blocks as FORWARD_BLOCKS_PER_SM per SM hold at once, not more (rounded down:
    a second wave of a few blocks would take as long as the first), and no slice shorter than
    FORWARD_MIN_SLICE_ROWS rows; at least 1."""
    wanted = FORWARD_BLOCKS_PER_SM * sm_count // max(b, 1)
    return max(1, min(wanted, i // FORWARD_MIN_SLICE_ROWS))


@dataclasses.dataclass(frozen=True)
class SlicedPlan:
    """The sliced forward's launch geometry: S slices of ``rows_per_slice`` rows per example (the
    last one shorter), ``tile_rows`` rows staged in shared memory at a time, ``groups`` column
    groups of J*D (J*D/VEC with vector loads, else J*D), ``thread_rows`` = R."""

    slices: int
    rows_per_slice: int
    tile_rows: int
    groups: int
    thread_rows: int
    shared_values: int


def sliced_plan(u_hat_shape, dtype, slices: int, threads: int = FORWARD_SLICED_THREADS, vec: bool = False):
    """The SlicedPlan for u_hat of this shape with at most ``slices`` slices (every slice non-empty),
    or None when even one staged row does not fit a block's shared memory."""
    _, i, j, d = u_hat_shape
    jd = j * d
    rows_per_slice = -(-i // max(1, min(slices, i)))
    groups = jd // vector_width(dtype) if vec else jd
    thread_rows = max(1, threads // groups)
    fixed, per_row = (thread_rows + 1) * jd, jd + groups + j  # sums and v; a staged row, its dots and logits
    tile_rows = (FORWARD_TILE_BYTES // np.dtype(dtype).itemsize - fixed) // per_row
    if tile_rows >= thread_rows:
        tile_rows -= tile_rows % thread_rows  # every thread row gets as many rows of a full tile
    tile_rows = max(1, min(tile_rows, rows_per_slice))
    values = fixed + tile_rows * per_row
    if not fits_shared_memory(values, dtype):
        return None
    return SlicedPlan(-(-i // rows_per_slice), rows_per_slice, tile_rows, groups, thread_rows, values)


def forward_fits(u_hat_shape, dtype, threads: int = FORWARD_THREADS) -> bool:
    """Whether routing_forward can run for u_hat of this shape and dtype: one of its kernels fits
    a block's shared memory (the one-block kernel with ``threads``, or the sliced one)."""
    _, _, j, d = u_hat_shape
    if j * d == 0:
        return False
    return (fits_shared_memory(forward_shared_values(j, d, threads), dtype)
            or sliced_plan(u_hat_shape, dtype, 1, min(threads, FORWARD_SLICED_THREADS)) is not None)


def choose_forward_slices(u_hat_shape, dtype, sm_count: int) -> int:
    """The heuristic behind ``routing_forward(slices=None)``: :func:`forward_slices` for the batch
    and the GPU; SINGLE_BLOCK (the one-launch kernel) where that is one slice and an example's
    u_hat (I*J*D values) is at most FORWARD_SINGLE_BLOCK_BYTES, small enough that its re-reads
    within the launch come from the SM's cache and launches, not bytes, cost most."""
    b, i, j, d = u_hat_shape
    slices = forward_slices(b, i, sm_count)
    if slices == 1 and i * j * d * np.dtype(dtype).itemsize <= FORWARD_SINGLE_BLOCK_BYTES:
        return SINGLE_BLOCK
    return slices


def routing_forward(u_hat, iterations: int, eps: float = 1e-8, runner=None, threads: int | None = None,
                    slices: int | None = None, sm_count: int | None = None):
    """Dynamic routing without a gradient. u_hat (B,I,J,D) -> (v (B,J,D), c (B,I,J) of the last
    iteration, b (B,I,J) of the last iteration).

    Computes, from logits b = 0, ``iterations`` times: c = softmax_J(b); s = sum_i c u_hat;
    v = squash(s, eps); and, but for the last time, b += u_hat . v. Two kernels:

    - ``slices=SINGLE_BLOCK`` (0): one block per example, every iteration in one launch
      (``threads`` default FORWARD_THREADS).
    - ``slices=S`` >= 1: S blocks per example, each over a slice of ceil(I/S) rows, one launch per
      iteration (``threads`` default FORWARD_SLICED_THREADS). Each launch reads u_hat once; each
      block writes its slice's partial s, and the block of each example that finishes last adds
      the S partial sums in slice order and squashes them: bitwise the same result whatever order
      the blocks run in. S is capped at I.
    - ``slices=None``: :func:`choose_forward_slices` with the SM count of u_hat's GPU (``sm_count``
      overrides it; FORWARD_DEFAULT_SMS for NumPy arrays). So the split, and with it the last bits
      of a float32 result, depend on the batch, I and the GPU's SM count, never on the run.

    Where the kernel chosen does not fit shared memory the other one runs (slices=None only).

    With ``slices``, ``threads`` and ``sm_count`` all None, the split is the variant measured fastest
    on this GPU for these shapes (tune.KERNELS "routing_forward": the heuristic's, one block, half or
    twice the heuristic's slices), the heuristic's where nothing is measured (see tune.py)."""
    xp, (u_hat,) = prepare("routing_forward", {"u_hat": u_hat}, {"u_hat": 4})
    if iterations < 1:
        raise ValueError(f"routing_forward: iterations must be >= 1, got {iterations}")
    b, i, j, d = u_hat.shape
    check_int32("routing_forward", B=b, I=i, J=j, D=d, BIJD=u_hat.size, IJ=i * j)
    if min(b, i, j, d) == 0:
        raise ValueError(f"routing_forward: u_hat of shape {tuple(u_hat.shape)} has an empty axis")
    if threads is not None and not 1 <= threads <= FORWARD_THREADS:
        raise ValueError(f"routing_forward: threads must be from 1 to {FORWARD_THREADS} (the kernel's launch "
                         f"bounds), got {threads}")
    if slices is not None and slices < 0:
        raise ValueError(f"routing_forward: slices must be None, SINGLE_BLOCK (0) or >= 1, got {slices}")
    runner = runner or default_runner([u_hat])
    if slices is None and threads is None and sm_count is None:
        slices = _tuned_forward_slices(u_hat, iterations, eps, runner)
    width = vector_width(u_hat.dtype)
    vec = d % width == 0 and aligned(u_hat)
    single_fits = fits_shared_memory(forward_shared_values(j, d, threads or FORWARD_THREADS), u_hat.dtype)
    automatic = slices is None
    if automatic:
        slices = choose_forward_slices(u_hat.shape, u_hat.dtype,
                                       sm_count or multiprocessor_count(u_hat, FORWARD_DEFAULT_SMS))
    plan = None
    if slices != SINGLE_BLOCK:
        plan = sliced_plan(u_hat.shape, u_hat.dtype, slices, threads or FORWARD_SLICED_THREADS, vec)
        if plan is None and vec:  # the scalar kernel stages fewer values per row
            vec, plan = False, sliced_plan(u_hat.shape, u_hat.dtype, slices, threads or FORWARD_SLICED_THREADS)
        if plan is None and automatic and single_fits:
            slices = SINGLE_BLOCK
    elif automatic and not single_fits:
        slices = 1
        plan = sliced_plan(u_hat.shape, u_hat.dtype, 1, threads or FORWARD_SLICED_THREADS)
    if (slices == SINGLE_BLOCK and not single_fits) or (slices != SINGLE_BLOCK and plan is None):
        raise ValueError(f"routing_forward: J*D = {j * d} values per example do not fit shared memory with "
                         f"{threads or (FORWARD_THREADS if slices == SINGLE_BLOCK else FORWARD_SLICED_THREADS)} "
                         f"threads")
    v = empty_like_output(xp, (b, j, d), u_hat.dtype, like=u_hat)
    c = empty_like_output(xp, (b, i, j), u_hat.dtype, like=u_hat)
    logits = empty_like_output(xp, (b, i, j), u_hat.dtype, like=u_hat)
    eps_scalar = u_hat.dtype.type(eps)
    if slices == SINGLE_BLOCK:
        threads = threads or FORWARD_THREADS
        shared = forward_shared_values(j, d, threads) * u_hat.itemsize
        runner(KernelLaunch("routing.cu", f"routing_forward_{suffix(u_hat.dtype)}", (min(b, block_limit(runner)),),
                            (threads,), (u_hat, v, c, logits) + i32(b, i, j, d, iterations) + (eps_scalar,),
                            outputs=(1, 2, 3), shared_mem=shared))
        return v, c, logits
    return _routing_forward_sliced(xp, u_hat, v, c, logits, iterations, eps_scalar, plan, vec, runner,
                                   threads or FORWARD_SLICED_THREADS)


def _tuned_forward_slices(u_hat, iterations, eps, runner):
    """routing_forward's ``slices`` from tune.choose: None (the heuristic), SINGLE_BLOCK or a count."""
    b, i, j, d = u_hat.shape
    sms = multiprocessor_count(u_hat, FORWARD_DEFAULT_SMS)
    base = forward_slices(b, i, sms)
    counts = {"heuristic": None, "half-slices": max(1, base // 2), "double-slices": min(i, 2 * base)}
    if fits_shared_memory(forward_shared_values(j, d), u_hat.dtype):
        counts["one-block"] = SINGLE_BLOCK
    candidates = {}
    for name, count in counts.items():
        if count is None:
            candidates[name] = lambda run: routing_forward(u_hat, iterations, eps, run, sm_count=sms)
        elif count == SINGLE_BLOCK or (count != base and sliced_plan(u_hat.shape, u_hat.dtype, count) is not None):
            candidates[name] = lambda run, count=count: routing_forward(u_hat, iterations, eps, run, slices=count)
    return counts[tune.choose("routing_forward", u_hat, (u_hat.shape, iterations), candidates, runner)]


def _routing_forward_sliced(xp, u_hat, v, c, logits, iterations, eps_scalar, plan, vec, runner, threads):
    """One launch of routing_forward_sliced per iteration (see routing.cu); v of iteration k is
    written to one of two buffers, read by launch k+1; the logits are updated in place."""
    b, i, j, d = u_hat.shape
    partial = empty_like_output(xp, (b, plan.slices, j * d), u_hat.dtype, like=u_hat)
    if vec and not aligned(partial):
        vec = False
        plan = sliced_plan(u_hat.shape, u_hat.dtype, plan.slices, threads)
        if plan is None:
            raise ValueError(f"routing_forward: J*D = {j * d} values per example do not fit shared memory with "
                             f"{threads} threads")
    with on_device_of(u_hat):
        counters = xp.zeros((iterations, b), dtype=np.uint32)  # one row of tickets per launch (set back to 0 by it)
    buffers = [v] + ([empty_like_output(xp, (b, j, d), u_hat.dtype, like=u_hat)] if iterations > 1 else [])
    grid = (min(b * plan.slices, block_limit(runner)),)
    kernel = f"routing_forward_sliced_{suffix(u_hat.dtype)}"
    first_logits = min(1, iterations - 1)  # the launch that first writes every logit (0 when it is also the last)
    for k in range(iterations):
        last = k == iterations - 1
        # v of the last iteration lands in ``v``: launch k writes buffer (iterations - 1 - k) % 2
        v_next = buffers[(iterations - 1 - k) % len(buffers)]
        v_prev = buffers[(iterations - k) % len(buffers)]  # v of launch k - 1 (unread by launch 0)
        outputs = (2, 5) + ((3,) if k == first_logits else ()) + ((4,) if last else ())
        runner(KernelLaunch("routing.cu", kernel, grid, (threads,),
                            (u_hat, v_prev, v_next, logits, c, partial, counters[k])
                            + i32(b, i, j, d, plan.slices, plan.rows_per_slice, plan.tile_rows, k > 0, k >= 2,
                                  k >= 1 or last, last, vec) + (eps_scalar,),
                            outputs=outputs, shared_mem=plan.shared_values * u_hat.itemsize))
    return v, c, logits
