"""Instruments watch the tape through one interface, autograd.Observer, registered per thread: told
of each forward, each node's backward and each gradient sum; nothing is told without one."""
import threading

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.autograd import grad_mode
import tinygrad_caps.functional as F
from tinygrad_caps import autograd


class Log(autograd.Observer):
    def __init__(self, sees_backward_ops=False):
        self.sees_backward_ops = sees_backward_ops
        self.events = []

    def clock(self, arrays=()):
        return len(self.events)

    def forward_recorded(self, fn, inputs, output, start):
        self.events.append(("forward", fn.name, start, output.shape))

    def node_backward(self, fn, grad_output, grads, start):
        self.events.append(("backward", fn.name, start, len(grads)))

    def gradient_summed(self, result, start, created):
        self.events.append(("sum", created))


def test_an_observer_is_told_of_forwards_backwards_and_sums_in_order():
    x = tc.tensor(np.ones(3), requires_grad=True)
    with autograd.observing(Log()) as log:
        y = F.sum(x * x)  # x reaches Mul by two paths: one sum
        y.backward()
    assert [e[:2] for e in log.events] == [("forward", "Mul"), ("forward", "Sum"), ("backward", "Sum"),
                                           ("backward", "Mul"), ("sum", True)]
    assert [e[2] for e in log.events if e[0] != "sum"] == [0, 1, 2, 3]  # each start came from clock
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_ops_run_by_a_backward_are_told_only_to_observers_that_ask():
    x = tc.tensor(np.ones(3), requires_grad=True)
    with autograd.observing(Log()) as plain:
        F.sum(F.exp(x)).backward()
    with autograd.observing(Log(sees_backward_ops=True)) as every:
        F.sum(F.exp(x)).backward()
    assert [e[:2] for e in plain.events] == [("forward", "Exp"), ("forward", "Sum"), ("backward", "Sum"),
                                             ("backward", "Exp")]
    # Sum's backward broadcasts the gradient back (a reshape and a broadcast), Exp's multiplies by exp(x)
    assert [e[:2] for e in every.events] == [("forward", "Exp"), ("forward", "Sum"), ("forward", "Reshape"),
                                             ("forward", "BroadcastTo"), ("backward", "Sum"), ("forward", "Mul"),
                                             ("backward", "Exp")]


def test_observers_are_per_thread_and_leave_nothing_behind():
    x = tc.tensor(np.ones(3))
    seen_by_thread = {}
    with autograd.observing(Log()) as log:
        worker = threading.Thread(target=lambda: seen_by_thread.update(observer=grad_mode._state.observer,
                                                                         y=F.neg(x)))
        worker.start()
        worker.join()
        F.exp(x)
    assert seen_by_thread["observer"] is None and [e[1] for e in log.events] == ["Exp"]
    assert grad_mode._state.observer is None and grad_mode._state.observers == ()


def test_an_inner_observer_of_the_same_class_takes_the_place_of_the_outer():
    x = tc.tensor(np.ones(3))
    with tc.profile() as outer:
        F.exp(x)
        with tc.profile() as inner:
            F.neg(x)
        F.sqrt(x)
    assert set(outer.totals()) == {"Exp", "Sqrt"} and set(inner.totals()) == {"Neg"}


def test_a_profile_and_anomaly_detection_watch_together():
    x = tc.tensor(np.array([1.0, -1.0]), requires_grad=True)
    with tc.profile() as prof, tc.detect_anomaly():
        F.sum(F.exp(x)).backward()
        with pytest.raises(tc.AnomalyError, match="Log"), np.errstate(invalid="ignore"):
            F.log(x)
    assert prof.totals()["Exp"]["calls"] == 1 and prof.totals()["Exp"]["backward_s"] > 0
    assert grad_mode._state.observer is None and not tc.is_anomaly_enabled()
