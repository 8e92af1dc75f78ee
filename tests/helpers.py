"""Hypothesis strategies shared by the gradient property tests."""
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tinygrad_caps.testing import check_gradients


def floats(low=-2.0, high=2.0):
    return st.floats(low, high, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def away_from_zero(low=0.1, high=2.0):
    """Values in [-high, -low] U [low, high]: keeps finite differences off a kink at 0."""
    return st.one_of(floats(low, high), floats(-high, -low))


def on_grid(offset=0.0):
    """Values k/10 + offset in [-2, 2]: two grids with offsets 0 and 0.05 never tie."""
    return st.integers(-20, 20).map(lambda k: k / 10 + offset)


def shapes(min_dims=0, max_dims=3, min_side=1, max_side=3):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


@st.composite
def arrays(draw, shape, elements=None, unique=False):
    """A float64 array of ``shape``; for 2+ dimensions sometimes a transposed (non-contiguous) view."""
    shape = tuple(shape)
    as_view = len(shape) >= 2 and draw(st.booleans())
    base = tuple(reversed(shape)) if as_view else shape
    a = draw(hnp.arrays(np.float64, base, elements=elements if elements is not None else floats(), unique=unique))
    return a.T if as_view else a


def check_both(f, inputs, **kw):
    """Backward and double backward of ``f`` against central differences, and no write into the
    inputs or the upstream gradient (``tinygrad_caps.testing.check_gradients``)."""
    check_gradients(f, inputs, double=True, **kw)
