"""The im2col/col2im CUDA kernels, run on the CPU by the emulation harness, on the same asymmetric
cases as the engine's convolution tests (engine/test_conv.py; the cases are in support/conv_cases.py):
per-axis kernel, stride and padding, every batch size of BATCHES, both column orders, against the
naive float64 loops of oracles/naive_conv.py."""
import shutil

import numpy as np
import pytest
from hypothesis import given, strategies as st

from conv_cases import ASYMMETRIC, BATCHES, conv_case
from naive_conv import naive_col2im, naive_im2col
from tinygrad_caps.kernels import conv
from tinygrad_caps.kernels.checking.emulation import Emulator

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulation needs g++")


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


def check_kernels(emulator, x, kernel, stride, padding, batch_last):
    col = conv.im2col(x, kernel, stride, padding, batch_last, emulator, threads=32)
    np.testing.assert_array_equal(col, naive_im2col(x, kernel, stride, padding, batch_last))
    r = np.random.default_rng(x.shape[0]).standard_normal(col.shape)
    back = conv.col2im(r, x.shape, kernel, stride, padding, batch_last, emulator, threads=32)
    np.testing.assert_allclose(back, naive_col2im(r, x.shape, kernel, stride, padding, batch_last), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batch_last", [False, True])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("kernel, stride, padding, output_padding", ASYMMETRIC)
def test_kernels_on_asymmetric_cases_equal_naive_loops(emulator, n, kernel, stride, padding, output_padding, batch_last):
    x = np.random.default_rng(n).standard_normal((n, 2, 6, 5))
    check_kernels(emulator, x, kernel, stride, padding, batch_last)


@given(case=conv_case(), batch_last=st.booleans())
def test_kernels_on_the_conv_property_cases_equal_naive_loops(emulator, case, batch_last):
    x, w, _, stride, padding = case
    check_kernels(emulator, np.ascontiguousarray(x), w.shape[2:], stride, padding, batch_last)
