"""DLPack without PyTorch (tests/engine/test_dlpack.py needs it): ``from_dlpack`` of one of our own
Tensors shares its version counter both ways, so an in-place change through either is caught by a
backward that saved the other, and ``copy=True`` copies, for our Tensors, NumPy arrays and a
producer that predates DLPack 1.0's copy argument."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.errors import GraphError


def test_a_change_through_the_shared_tensor_is_caught_by_a_backward_that_saved_the_original():
    a = tc.tensor(np.arange(3.0), requires_grad=True)
    y = F.sum(a * a)  # saves a
    shared = tc.from_dlpack(a)
    assert np.shares_memory(shared.data, a.data)
    before = a._version
    with tc.no_grad():
        shared.add_(1.0)
    assert a._version == shared._version == before + 1  # one counter, seen from both
    with pytest.raises(GraphError):
        y.backward()


def test_a_change_through_the_original_is_caught_by_a_backward_that_saved_the_shared_tensor():
    a = tc.tensor(np.arange(3.0), requires_grad=True)
    shared = tc.from_dlpack(a.detach(), requires_grad=True)
    y = F.sum(shared * shared)  # saves the shared tensor
    with tc.no_grad():
        a.mul_(2.0)
    assert shared.numpy().tolist() == [0.0, 2.0, 4.0]  # the memory is shared
    with pytest.raises(GraphError):
        y.backward()


def test_a_round_trip_keeps_one_counter_and_an_unchanged_tensor_still_differentiates():
    a = tc.tensor(np.arange(4.0), requires_grad=True)
    twice = tc.from_dlpack(tc.from_dlpack(a))
    y = F.sum(a * a)
    with tc.no_grad():
        twice.add_(-1.0)
    with pytest.raises(GraphError):
        y.backward()
    b = tc.tensor(np.arange(4.0), requires_grad=True)
    shared = tc.from_dlpack(b)
    F.sum(b * b).backward()  # nothing changed: the shared counter does not trip a plain backward
    np.testing.assert_array_equal(b.grad.numpy(), 2 * np.arange(4.0))
    assert shared._version == b._version


def test_copy_true_of_our_tensor_is_a_separate_leaf_with_its_own_memory_and_counter():
    a = tc.tensor(np.arange(3.0), requires_grad=True)
    y = F.sum(a * a)
    copied = tc.from_dlpack(a, copy=True)
    assert not np.shares_memory(copied.data, a.data)
    with tc.no_grad():
        copied.add_(10.0)
    assert a.numpy().tolist() == [0.0, 1.0, 2.0] and copied.numpy().tolist() == [10.0, 11.0, 12.0]
    y.backward()  # the copy's change is not a change of a
    np.testing.assert_array_equal(a.grad.numpy(), [0.0, 2.0, 4.0])
    with tc.no_grad():
        a.add_(1.0)
    assert copied.numpy().tolist() == [10.0, 11.0, 12.0]
    graded = tc.from_dlpack(a, copy=True, requires_grad=True)
    assert graded.requires_grad and graded.creator is None and not np.shares_memory(graded.data, a.data)


@pytest.mark.parametrize("copy, shared", [(None, True), (False, True), (True, False)])
def test_copy_of_a_numpy_array_follows_the_flag(copy, shared):
    array = np.arange(6.0).reshape(2, 3)
    t = tc.from_dlpack(array, copy=copy)
    assert np.shares_memory(t.data, array) == shared
    array[0, 0] = 7.0
    assert t.numpy()[0, 0] == (7.0 if shared else 0.0)


class OldProducer:
    """A producer from before DLPack 1.0: its ``__dlpack__`` takes no ``copy`` argument."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@pytest.mark.parametrize("copy, shared", [(None, True), (True, False)])
def test_copy_of_a_producer_without_the_copy_argument_follows_the_flag(copy, shared):
    array = np.arange(4.0)
    t = tc.from_dlpack(OldProducer(array), copy=copy)
    assert np.shares_memory(t.data, array) == shared
    array[1] = 9.0
    assert t.numpy()[1] == (9.0 if shared else 1.0)
