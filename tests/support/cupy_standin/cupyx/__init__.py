"""``cupyx`` of the CPU stand-in for CuPy (``tests/support/cupy_standin/cupy``)."""


def scatter_add(a, slices, value):
    """``a[slices] += value``, repeated indices accumulated (on ``a``'s device, which must be current)."""
    a.scatter_add(slices, value)
