"""Launchers for im2col.cu: ``im2col`` and ``col2im`` on NCHW float32/float64 arrays."""
from __future__ import annotations

import numpy as np

from . import tune
from .launch import (DEFAULT_THREADS, MAX_BLOCKS, MAX_GRID_DIM, MAX_SHARED_BYTES, MAX_THREADS_PER_BLOCK, KernelLaunch,
                     aligned, block_limit, check_int32, default_runner, empty_like_output, grid_for, i32, prepare,
                     suffix)

INT32_LIMIT = 2 ** 31
ROW_COLUMNS_PER_THREAD = 4  # im2col_rows and im2col_planes: consecutive columns per thread
PLANE_BYTES = 16 * 1024     # im2col_planes: the shared memory a block stages image planes in


def planes_plan(image_shape, kernel_hw, out_hw, dtype, threads: int):
    """(images per block, row groups, block size, shared bytes) of im2col_planes, or None where one
    image plane does not fit shared memory or one image's columns need more than ``threads`` threads."""
    n, _, h, w = image_shape
    (kh, kw), (oh, ow) = kernel_hw, out_hw
    plane_bytes = h * w * np.dtype(dtype).itemsize
    images = min(n, PLANE_BYTES // plane_bytes, threads * ROW_COLUMNS_PER_THREAD // (oh * ow))
    if images >= ROW_COLUMNS_PER_THREAD:
        images -= images % ROW_COLUMNS_PER_THREAD  # a group's columns then start 16-byte aligned
    if images < 1 or plane_bytes * images > MAX_SHARED_BYTES:
        return None
    quads = -(-images * oh * ow // ROW_COLUMNS_PER_THREAD)
    row_groups = max(1, min(kh * kw, threads // quads))
    return images, row_groups, quads * row_groups, images * plane_bytes


def _output_size(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def _geometry(op, image_shape, kernel, stride, padding):
    n, c, h, w = image_shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    if min(sh, sw) < 1 or min(ph, pw) < 0 or min(kh, kw) < 1:
        raise ValueError(f"{op}: invalid kernel {kernel}, stride {stride} or padding {padding}")
    oh, ow = _output_size(h, kh, sh, ph), _output_size(w, kw, sw, pw)
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: kernel {kernel} does not fit image {image_shape} with padding {padding}")
    check_int32(op, N=n, C=c, H=h, W=w)
    return n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow


def _kernel_name(op, dtype, sizes, index_bits):
    """``op_f32`` (64-bit indices) or ``op_i32_f32`` when every index and the grid-stride overshoot fit 32 bits."""
    if index_bits not in (None, 32, 64):
        raise ValueError(f"{op}: index_bits must be None, 32 or 64, got {index_bits}")
    fits = max(sizes) + MAX_BLOCKS * MAX_THREADS_PER_BLOCK < INT32_LIMIT  # idx + one grid stride stays below 2^31
    if index_bits == 32 and not fits:
        raise ValueError(f"{op}: sizes {sizes} need 64-bit indices")
    use_32 = fits if index_bits is None else index_bits == 32
    return f"{op}_i32_{suffix(dtype)}" if use_32 else f"{op}_{suffix(dtype)}"


IM2COL_VARIANTS = {"planes": (True, True), "rows": (True, False), "elements": (False, False)}  # (by_rows, planes)


def _im2col_variants(x_shape, kernel_hw, out_hw, dtype, columns: int, rows: int, batch_last: bool, threads: int,
                     blocks: int, x_size: int) -> list:
    """The im2col variants that can run for these sizes (tune.KERNELS "im2col"), in its order."""
    possible = ["elements"]
    if batch_last or columns >= INT32_LIMIT:
        return possible
    overshoot = MAX_BLOCKS * MAX_THREADS_PER_BLOCK * ROW_COLUMNS_PER_THREAD  # a column index plus one grid stride
    if rows <= min(MAX_GRID_DIM[1], blocks) and columns + overshoot < INT32_LIMIT and x_size < INT32_LIMIT:
        possible.insert(0, "rows")
    if planes_plan(x_shape, kernel_hw, out_hw, dtype, threads) is not None:
        possible.insert(0, "planes")
    return possible


def im2col(x, kernel, stride, padding, batch_last: bool, runner=None, threads: int | None = None,
           index_bits: int | None = None, by_rows: bool | None = None, planes: bool | None = None):
    """x (N, C, H, W) -> col (C*kh*kw, N*OH*OW); columns (oy, ox, n) if ``batch_last`` else (n, oy, ox).

    ``kernel``, ``stride`` and ``padding`` are (h, w) pairs; ``index_bits`` forces 32- or 64-bit
    index math (None: 32 where the sizes allow). For (n, oy, ox) columns ``im2col_planes`` serves
    where an image plane fits shared memory (``planes=False``: not), then ``im2col_rows``;
    ``by_rows=False`` forces the one-element-per-thread kernel instead of both (see im2col.cu).
    ``threads`` per block (default 256). With ``threads``, ``index_bits``, ``by_rows`` and ``planes``
    all None the kernel is the one measured fastest on this GPU for these shapes (tune.KERNELS
    "im2col"), else the first of planes, rows, elements that can run. Returns the new array.
    """
    xp, (x,) = prepare("im2col", {"x": x}, {"x": 4})
    geometry = _geometry("im2col", x.shape, kernel, stride, padding)
    n, c, _, _, kh, kw, _, _, _, _, oh, ow = geometry
    col = empty_like_output(xp, (c * kh * kw, n * oh * ow), x.dtype, like=x)
    tunable = threads is None and index_bits is None and by_rows is None and planes is None
    threads = threads or DEFAULT_THREADS
    by_rows = True if by_rows is None else by_rows
    planes = True if planes is None else planes
    if col.size:
        runner = runner or default_runner([x])
        rows, columns = col.shape
        if tunable:
            possible = _im2col_variants(x.shape, (kh, kw), (oh, ow), x.dtype, columns, rows, batch_last, threads,
                                        block_limit(runner), x.size)
            candidates = {name: (lambda run, by_rows=IM2COL_VARIANTS[name][0], planes=IM2COL_VARIANTS[name][1]:
                                 im2col(x, kernel, stride, padding, batch_last, run, DEFAULT_THREADS, None, by_rows,
                                        planes)) for name in possible}
            shapes = (x.shape, tuple(kernel), tuple(stride), tuple(padding), bool(batch_last))
            by_rows, planes = IM2COL_VARIANTS[tune.choose("im2col", x, shapes, candidates, runner)]
        plan = planes_plan(x.shape, (kh, kw), (oh, ow), x.dtype, threads) \
            if planes and by_rows and not batch_last and index_bits != 64 and columns < INT32_LIMIT else None
        if plan is not None:
            images, row_groups, block, shared = plan
            vec = int(columns % 4 == 0 and images * oh * ow % 4 == 0 and aligned(col))
            tasks = c * -(-n // images)
            runner(KernelLaunch("im2col.cu", f"im2col_planes_{suffix(x.dtype)}", (min(tasks, block_limit(runner)),),
                                (block,), (x, col) + i32(*geometry, images, row_groups, vec), outputs=(1,),
                                shared_mem=shared))
            return col
        overshoot = MAX_BLOCKS * MAX_THREADS_PER_BLOCK * ROW_COLUMNS_PER_THREAD  # a column index plus one grid stride
        blocks = block_limit(runner)  # (the emulator may cap the blocks of a whole grid)
        if by_rows and not batch_last and index_bits != 64 and rows <= min(MAX_GRID_DIM[1], blocks) and \
                columns + overshoot < INT32_LIMIT and x.size < INT32_LIMIT:
            grid = (max(1, min(blocks // rows, -(-columns // (threads * ROW_COLUMNS_PER_THREAD)))), rows)
            vec = int(columns % ROW_COLUMNS_PER_THREAD == 0 and aligned(col))  # every row starts 16-byte aligned
            runner(KernelLaunch("im2col.cu", f"im2col_rows_{suffix(x.dtype)}", grid, (threads,),
                                (x, col) + i32(*geometry, vec), outputs=(1,)))
            return col
        name = _kernel_name("im2col", x.dtype, (col.size, x.size), index_bits)
        runner(KernelLaunch("im2col.cu", name, grid_for(col.size, threads, runner), (threads,),
                            (x, col) + i32(*geometry, int(batch_last)), outputs=(1,)))
    return col


def col2im(col, image_shape, kernel, stride, padding, batch_last: bool, runner=None, threads: int = DEFAULT_THREADS,
           index_bits: int | None = None):
    """col (C*kh*kw, N*OH*OW) -> image (N, C, H, W): the adjoint of ``im2col``, summing overlaps.

    Gathers per output pixel over exactly the kernel offsets that reach it, in a fixed order:
    deterministic, no atomics. Returns the new array.
    """
    xp, (col,) = prepare("col2im", {"col": col}, {"col": 2})
    geometry = _geometry("col2im", tuple(image_shape), kernel, stride, padding)
    n, c, h, w, kh, kw, _, _, _, _, oh, ow = geometry
    if col.shape != (c * kh * kw, n * oh * ow):
        raise ValueError(f"col2im: col has shape {tuple(col.shape)}, expected {(c * kh * kw, n * oh * ow)} "
                         f"for image {tuple(image_shape)} and kernel {kernel}")
    x = empty_like_output(xp, (n, c, h, w), col.dtype, like=col)
    if x.size:
        runner = runner or default_runner([col])
        name = _kernel_name("col2im", col.dtype, (col.size, x.size), index_bits)
        runner(KernelLaunch("im2col.cu", name, grid_for(x.size, threads, runner), (threads,),
                            (col, x) + i32(*geometry, int(batch_last)), outputs=(1,)))
    return x
