"""DLPack exchange (tc.from_dlpack, Tensor.__dlpack__): memory shared both ways with NumPy and
PyTorch (JAX when installed), dtypes and strides kept, 0-d arrays, and a gradient computed here on
exchanged data equal to PyTorch's. The GPU side runs on the CuPy stand-in in CI and for real on a GPU."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F

from standin import run_standin
from paths import SUPPORT

torch = pytest.importorskip("torch")

DTYPES = [np.float32, np.float64, np.int64, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_and_tensors_share_memory_both_ways(dtype):
    array = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    t = tc.from_dlpack(array)
    assert t.dtype == np.dtype(dtype) and t.shape == (2, 3) and np.shares_memory(t.data, array)
    array[0, 0] = 1
    assert t.numpy()[0, 0] == 1
    back = np.from_dlpack(t)
    assert np.shares_memory(back, array)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pytorch_and_tensors_share_memory_both_ways(dtype):
    source = torch.from_numpy((np.arange(6) % 2).astype(dtype).reshape(2, 3))
    t = tc.from_dlpack(source)
    source[1, 2] = 0
    assert t.numpy()[1, 2] == 0
    exported = torch.from_dlpack(t)
    t.data[0, 1] = 1
    assert exported[0, 1].item() == 1 and exported.dtype == source.dtype


def test_strides_and_0d_arrays_are_kept():
    transposed = torch.arange(12.0).reshape(3, 4).T
    t = tc.from_dlpack(transposed)
    assert t.shape == (4, 3) and t.data.strides == (4, 16)  # the transposed view, in bytes
    np.testing.assert_array_equal(t.numpy(), transposed.numpy())
    sliced = np.arange(20.0)[::3]
    assert tc.from_dlpack(sliced).data.strides == (24,)
    scalar = tc.from_dlpack(np.array(2.5))
    assert scalar.shape == () and scalar.item() == 2.5
    assert torch.from_dlpack(scalar).item() == 2.5


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_a_0d_result_of_a_reduction_exports_to_pytorch_and_numpy(dtype):
    loss = F.sum(tc.tensor(np.array([1.5, 2.0, 3.0]).astype(dtype)))  # NumPy's sum gives a scalar, not an array
    for exported in (torch.from_dlpack(loss).numpy(), np.from_dlpack(loss)):
        assert exported.shape == () and exported.dtype == np.dtype(dtype)
        np.testing.assert_allclose(exported, np.array([1.5, 2.0, 3.0]).astype(dtype).sum(), rtol=1e-6, atol=1e-6)
    assert loss.__dlpack_device__() == (1, 0)
    mean = F.mean(tc.tensor(np.ones((2, 3), dtype=np.float32)))
    assert torch.from_dlpack(mean).dtype == torch.float32 and torch.from_dlpack(mean).item() == 1.0
    assert tc.from_dlpack(loss, copy=True).dtype == np.dtype(dtype)


def test_a_bfloat16_tensor_is_a_type_error_naming_the_dtypes():
    for copy in (None, True):
        with pytest.raises(TypeError, match=r"dtype bfloat16 .*accepted dtypes: bool, .*float16, float32, float64"):
            tc.from_dlpack(torch.ones(3, dtype=torch.bfloat16), copy=copy)
    assert tc.from_dlpack(torch.ones(3, dtype=torch.bfloat16).float()).dtype == np.float32


def test_a_tensor_shared_with_itself_keeps_one_version_counter():
    from tinygrad_caps.errors import GraphError

    a = tc.tensor(np.ones(3), requires_grad=True)
    y = F.sum(a * a)
    shared = tc.from_dlpack(a)
    assert np.shares_memory(shared.data, a.data)
    with tc.no_grad():
        shared.add_(1.0)
    with pytest.raises(GraphError):
        y.backward()  # a's saved value changed through the shared tensor
    assert not np.shares_memory(tc.from_dlpack(a, copy=True).data, a.data)


def test_a_copy_when_asked_and_clear_errors():
    array = np.ones(3)
    copied = tc.from_dlpack(array, copy=True)
    array[0] = 5
    assert copied.numpy()[0] == 1
    with pytest.raises(TypeError, match="__dlpack__"):
        tc.from_dlpack([1.0, 2.0])


def test_a_gradient_on_exchanged_data_equals_pytorchs():
    rng = np.random.default_rng(0)
    x_torch = torch.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    w_torch = torch.tensor(rng.standard_normal((3, 2)), requires_grad=True)
    (torch.tanh(x_torch @ w_torch) ** 2).sum().backward()
    x = tc.from_dlpack(x_torch.detach(), requires_grad=True)
    w = tc.from_dlpack(w_torch.detach(), requires_grad=True)
    F.sum(F.tanh(x @ w) ** 2).backward()
    np.testing.assert_allclose(x.grad.numpy(), x_torch.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(torch.from_dlpack(w.grad).numpy(), w_torch.grad.numpy(), rtol=1e-12)


def test_jax_arrays_come_in_when_jax_is_installed():
    jnp = pytest.importorskip("jax.numpy")
    t = tc.from_dlpack(jnp.arange(4.0))
    assert t.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_gpu_side_on_the_stand_in():
    assert run_standin([str(SUPPORT / "standin_scenarios.py"), "dlpack_on_the_gpu"], devices=2).split() == ["ok"]


@pytest.mark.gpu
def test_gpu_tensors_share_memory_with_cupy_and_pytorch():
    import cupy

    array = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    t = tc.from_dlpack(array)
    # Tensor.device names the current GPU "cuda"; the absolute name says which GPU holds the data
    assert tc.backend.absolute_device_of(t.data) == "cuda:0" and t.device == tc.backend.device_of(array)
    assert t.data.data.ptr == array.data.ptr
    array[0, 0] = 7
    assert float(t.data[0, 0]) == 7
    if torch.cuda.is_available():
        exported = torch.from_dlpack(t)
        exported[1, 1] = 3
        assert float(t.data[1, 1]) == 3
        back = tc.from_dlpack(exported.T)
        assert back.shape == (3, 2) and back.data.data.ptr == array.data.ptr
