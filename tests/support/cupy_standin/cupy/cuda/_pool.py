"""``cupy.cuda.MemoryPool`` of the CPU stand-in: a model of CuPy's pool, chunk by chunk, for a pool
of one's own (``cupy.cuda.MemoryPool()`` handed to ``set_allocator`` or ``using_allocator``; the
default pool keeps the stand-in's plain accounting, ``_DefaultPool``).

As in CuPy, each device has segments (one ``cudaMalloc`` each) cut into chunks: a new array gets
the smallest free chunk that fits (split; the rest stays free), else a new segment of exactly its
size rounded up to 512 bytes; a freed chunk merges with its free neighbours. ``total_bytes`` is
the segments' sum, ``used_bytes`` the chunks in use; ``free_all_blocks`` gives back the segments
with nothing in use.

The arrays keep NumPy memory of their own; what sharing device memory would do is modelled:

- an array is freed when only the pool still holds it (the pool looks at each allocation and
  each query, as the next allocation is the first to see a free in CuPy); its memory stays with
  the pool for as long as its segment does, as device memory that a captured graph may still
  use, so a graph's replay never finds it gone;
- a freed array is overwritten at once (NaN, -1 for integers, True for booleans), and inside a
  stream capture the overwrite is recorded as a graph step: a graph that reads an array after it
  was freed (its memory may be another array's by then on a GPU) reads garbage in every replay.

The frees of these arrays reach memory hooks only when the pool lets their memory go.
"""
from __future__ import annotations

import sys

import numpy


def _pool_size(nbytes: int) -> int:
    return max(512, -(-int(nbytes) // 512) * 512)


def _overwrite(array) -> None:
    """Fill a freed array with what reused memory might hold."""
    kind = array.dtype.kind
    array.fill(numpy.nan if kind in "fc" else True if kind == "b" else -1 if kind in "iu" else 0)


class _Chunk:
    __slots__ = ("size", "used", "array")

    def __init__(self, size):
        self.size, self.used, self.array = size, False, None


class _Segment:
    """One cudaMalloc: chunks in address order, and every array ever placed here (their memory is this segment's)."""

    def __init__(self, size):
        self.size, self.chunks, self.held = size, [_Chunk(size)], []


class _Arena:
    """One device's segments."""

    def __init__(self):
        self.segments = []

    def collect(self) -> None:
        """Free the chunks whose array only the pool holds (overwriting the array), then merge free neighbours."""
        from .. import _capture

        for segment in self.segments:
            merged = []
            for chunk in segment.chunks:
                # references: chunk.array, segment.held, and getrefcount's own argument
                if chunk.array is not None and sys.getrefcount(chunk.array) <= 3:
                    _overwrite(chunk.array)
                    capture = _capture()
                    if capture is not None:
                        capture.record(_overwrite, (chunk.array,), {}, None, "memory reused")
                    chunk.used, chunk.array = False, None
                if merged and not merged[-1].used and not chunk.used:
                    merged[-1].size += chunk.size
                else:
                    merged.append(chunk)
            segment.chunks = merged

    def allocate(self, size: int):
        """(segment, chunk) for ``size`` bytes: the smallest free chunk that fits, else a new segment."""
        self.collect()
        best = None
        for segment in self.segments:
            for index, chunk in enumerate(segment.chunks):
                if not chunk.used and chunk.size >= size and (best is None or chunk.size < best[2].size):
                    best = (segment, index, chunk)
        if best is None:
            segment = _Segment(size)
            self.segments.append(segment)
            best = (segment, 0, segment.chunks[0])
        segment, index, chunk = best
        if chunk.size > size:
            segment.chunks.insert(index + 1, _Chunk(chunk.size - size))
            chunk.size = size
        chunk.used = True
        return segment, chunk


class _PoolPointer:
    """What ``MemoryPool.malloc`` returns: the chunk the next array is placed in (``_hold``)."""

    def __init__(self, segment, chunk, device_id):
        self._segment, self._chunk, self.ptr, self.device_id = segment, chunk, 0, device_id

    def _hold(self, array):
        self._chunk.array, self.ptr = array, array.ctypes.data
        self._segment.held.append(array)


class MemoryPool:
    """A memory pool of one's own (see the module docstring); ``malloc`` serves the current device."""

    def __init__(self, allocator=None):
        self._arenas = {}

    def _arena(self) -> _Arena:
        from .. import _current_device

        return self._arenas.setdefault(_current_device(), _Arena())

    def malloc(self, size):
        """A MemoryPointer to a chunk of this pool; the array the stand-in makes next lives there."""
        from .. import _current_device

        segment, chunk = self._arena().allocate(_pool_size(size))
        return _PoolPointer(segment, chunk, _current_device())

    def used_bytes(self) -> int:
        arena = self._arena()
        arena.collect()
        return sum(c.size for s in arena.segments for c in s.chunks if c.used)

    def total_bytes(self) -> int:
        arena = self._arena()
        arena.collect()
        return sum(s.size for s in arena.segments)

    def free_bytes(self) -> int:
        return self.total_bytes() - self.used_bytes()

    def n_free_blocks(self) -> int:
        arena = self._arena()
        arena.collect()
        return sum(1 for s in arena.segments for c in s.chunks if not c.used)

    def free_all_blocks(self, stream=None) -> None:
        """Give back every segment with nothing in use (the memory of the arrays once placed there too)."""
        arena = self._arena()
        arena.collect()
        arena.segments = [s for s in arena.segments if any(c.used for c in s.chunks)]

    def set_limit(self, size=None, fraction=None):
        pass

    def get_limit(self):
        return 0
