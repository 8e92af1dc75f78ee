"""The convolution cases shared by the engine's convolution tests (engine/test_conv.py) and the
im2col/col2im kernels on the emulation (kernels/test_emulation_asymmetric_conv.py)."""
from hypothesis import strategies as st

from helpers import arrays

BATCHES = [1, 2, 7, 8, 9]  # batch_last switches the column order at 8 on NumPy: both sides, and the edge


@st.composite
def conv_case(draw):
    """Per-axis kernel, stride and padding (asymmetric ones included), a batch from BATCHES."""
    n = draw(st.sampled_from(BATCHES))
    c, o = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(max(1, kh - 2 * padding[0]), 5))
    w = draw(st.integers(max(1, kw - 2 * padding[1]), 5))
    x = draw(arrays((n, c, h, w)))
    weight = draw(arrays((o, c, kh, kw)))
    bias = draw(arrays((o,)))
    return x, weight, bias, stride, padding


ASYMMETRIC = [  # kernel, stride, padding, output_padding: every pair differs between the axes
    ((3, 2), (2, 1), (1, 0), (1, 0)),
    ((2, 3), (1, 3), (0, 2), (0, 2)),
    ((1, 3), (3, 2), (2, 1), (2, 1)),
    ((3, 2), (1, 2), (2, 3), (0, 1)),  # padding wider than the kernel
    ((2, 3), (1, 2), (0, 3), (0, 1)),  # the last window ends exactly on the far padding
]
