"""Optimizers with PyTorch's update rules: SGD (momentum, Nesterov, weight decay), Adam, AdamW.

Updates run on the raw arrays in place, outside the graph. Hyperparameters are attributes
(``opt.lr``), which the schedulers change.
"""
from __future__ import annotations

import math

import numpy as np

from .. import backend
from .._parallel import over_slices
from ..kernels import launch as kernel_launch
from ..kernels import optim as optim_kernels
from ..tensor import Tensor


class Optimizer:
    """Base class: holds the parameters, per-parameter state, and hyperparameters by name."""

    hyperparameters: tuple = ("lr",)

    def __init__(self, params, **hyper):
        self.params = []
        seen = set()
        for p in params:
            if not isinstance(p, Tensor) or not p.requires_grad:
                raise ValueError(f"{type(self).__name__}: every parameter must be a Tensor that requires grad, got {type(p).__name__}")
            if id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        if not self.params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        for name, value in hyper.items():
            setattr(self, name, value)
        if self.lr < 0:
            raise ValueError(f"{type(self).__name__}: invalid learning rate {self.lr}")
        self.state = [dict() for _ in self.params]

    @property
    def param_groups(self) -> list:
        """PyTorch-style access: one group whose entries read and write this optimizer's hyperparameters."""
        return [_ParamGroup(self)]

    def zero_grad(self) -> None:
        """Drop every parameter's gradient."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update every parameter that has a gradient."""
        for p, state in zip(self.params, self.state):
            if p.grad is not None:
                with backend.on_device_of(p.data):  # the state and temporaries live with the parameter
                    self.update(p.data, p.grad.data, state)  # in place, on the raw arrays
                p._bump_version()  # a graph that saved p now refuses a stale backward

    def update(self, param, grad, state) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """{"hyperparameters": {...}, "state": {"0": {...}, ...}} with arrays and plain values."""
        return {
            "hyperparameters": {name: getattr(self, name) for name in self.hyperparameters},
            "state": {str(i): dict(s) for i, s in enumerate(self.state)},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore hyperparameters and per-parameter state (arrays moved to each parameter's device)."""
        saved = state["state"]
        if len(saved) != len(self.params):
            raise ValueError(f"{type(self).__name__}.load_state_dict: {len(saved)} saved parameter states, "
                             f"optimizer has {len(self.params)} parameters")
        for name, value in state["hyperparameters"].items():
            setattr(self, name, tuple(value) if isinstance(value, list) else value)
        for i, p in enumerate(self.params):
            restored = {}
            for key, value in saved[str(i)].items():
                if getattr(value, "ndim", 0) > 0:
                    if tuple(value.shape) != p.shape:
                        raise ValueError(f"{type(self).__name__}.load_state_dict: state {key!r} of parameter {i} "
                                         f"has shape {tuple(value.shape)}, parameter has {p.shape}")
                    with backend.on_device_of(p.data):
                        value = backend.to_device(value, p.device).astype(p.dtype)
                elif hasattr(value, "item"):
                    value = value.item()
                restored[key] = value
            self.state[i] = restored


class _ParamGroup:
    """A view of an optimizer's hyperparameters as PyTorch's ``param_groups[0]`` dict."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def __getitem__(self, key):
        if key == "params":
            return self._optimizer.params
        if key not in self._optimizer.hyperparameters:
            raise KeyError(key)
        return getattr(self._optimizer, key)

    def __setitem__(self, key, value):
        if key not in self._optimizer.hyperparameters:
            raise KeyError(key)
        setattr(self._optimizer, key, value)

    def keys(self):
        return ("params",) + tuple(self._optimizer.hyperparameters)


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (dampening), Nesterov and L2 weight decay."""

    hyperparameters = ("lr", "momentum", "dampening", "nesterov", "weight_decay")

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                         weight_decay=weight_decay)

    def update(self, param, grad, state):
        if self.weight_decay:
            grad = grad + self.weight_decay * param
        if self.momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = grad.copy()
            else:
                buf *= self.momentum
                buf += (1 - self.dampening) * grad
            state["momentum_buffer"] = buf
            grad = grad + self.momentum * buf if self.nesterov else buf
        param -= self.lr * grad


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction, exactly PyTorch's update; optional AMSGrad, L2 decay.

    ``capturable=True`` (PyTorch's name) keeps the learning rate and every parameter's step count
    on the parameters' device, so that a CUDA graph that captured ``step()`` advances the bias
    corrections at each replay and follows ``lr`` changes made between replays (a scheduler's);
    it needs the fused update kernel (parameters on one GPU, or NumPy arrays inside
    ``kernels.launch.run_numpy_arrays_with``). ``state_dict()`` reads the counts back.
    """

    hyperparameters = ("lr", "betas", "eps", "weight_decay", "amsgrad")
    decoupled_decay = False
    chunk = 1 << 18  # elements per piece of a NumPy update: 1 MB an array in float32

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
                 capturable=False):
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{type(self).__name__}: betas must lie in [0, 1), got {betas}")
        self.capturable = bool(capturable)
        self._device_lr = self._device_steps = None
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = value
        if self._device_lr is not None:  # a replayed graph reads the rate from here, on its GPU's stream
            with backend.on_device_of(self._device_lr):
                self._device_lr.fill(float(value))

    def step(self) -> None:
        """Update every parameter that has a gradient (see the class docstring for ``capturable``)."""
        if not self.capturable:
            return super().step()
        stepped = [k for k, p in enumerate(self.params) if p.grad is not None]
        if not stepped:
            return
        runner = self._capturable_runner()
        lr, steps = self._device_counters()
        for k in stepped:
            p, state = self.params[k], self.state[k]
            with backend.on_device_of(p.data):
                xp = backend.array_module(p.data)
                if "exp_avg" not in state:
                    state["exp_avg"], state["exp_avg_sq"] = xp.zeros_like(p.data), xp.zeros_like(p.data)
                    if self.amsgrad:
                        state["max_exp_avg_sq"] = xp.zeros_like(p.data)
                optim_kernels.adam_step_capturable(
                    p.data, xp.ascontiguousarray(p.grad.data), state["exp_avg"], state["exp_avg_sq"],
                    state.get("max_exp_avg_sq"), steps[k:k + 1], lr, self.betas, self.eps, self.weight_decay,
                    self.decoupled_decay, runner=runner)
            p._bump_version()
        with backend.on_device_of(steps):
            if len(stepped) == len(self.params):
                optim_kernels.increment_counts(steps, runner=runner)
            else:
                for k in stepped:
                    optim_kernels.increment_counts(steps[k:k + 1], runner=runner)

    def _capturable_runner(self):
        first = self.params[0].data
        runner = kernel_launch.kernel_runner_for(first)
        devices = {backend.device_of(p.data) for p in self.params}
        if runner is None or len(devices) != 1 or not kernel_launch.has_kernels_for(first.dtype) or \
                any(p.dtype != first.dtype for p in self.params):
            raise ValueError(f"{type(self).__name__}(capturable=True) needs parameters of one float dtype on one GPU "
                             f"with the fused kernel, got {sorted(map(str, devices))}")
        return runner

    def _device_counters(self):
        """The learning rate and the per-parameter step counts on the parameters' device (made from
        the host values at the first capturable step and after ``load_state_dict``)."""
        if self._device_steps is None:
            first = self.params[0].data
            xp = backend.array_module(first)
            with backend.on_device_of(first):
                self._device_steps = xp.asarray(np.array([s.get("step", 0) for s in self.state], dtype=np.int32))
                self._device_lr = xp.asarray(np.array([float(self._lr)], dtype=np.float64))
        return self._device_lr, self._device_steps

    def state_dict(self) -> dict:
        if self._device_steps is not None:  # the counts a replayed graph advanced live on the device
            for state, count in zip(self.state, backend.to_numpy(self._device_steps).tolist()):
                if count:
                    state["step"] = int(count)
        return super().state_dict()

    def load_state_dict(self, state: dict) -> None:
        # A captured graph reads the moments, the rate and the counts where they are: restore them into
        # the same arrays (new arrays would leave the graph reading freed memory).
        before = [dict(s) for s in self.state]
        super().load_state_dict(state)
        for old, new in zip(before, self.state):
            for key, value in new.items():
                if getattr(old.get(key), "shape", None) is not None and getattr(value, "shape", None) == old[key].shape:
                    with backend.on_device_of(old[key]):
                        old[key][...] = value
                    new[key] = old[key]
        if self._device_steps is not None:
            lr, steps = self._device_lr, self._device_steps
            self._device_lr = self._device_steps = None
            new_lr, new_steps = self._device_counters()
            with backend.on_device_of(lr):
                lr[...] = new_lr
                steps[...] = new_steps
            self._device_lr, self._device_steps = lr, steps

    def update(self, param, grad, state):
        xp = backend.array_module(param)
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(param)
            state["exp_avg_sq"] = xp.zeros_like(param)
            if self.amsgrad:
                state["max_exp_avg_sq"] = xp.zeros_like(param)
        state["step"] += 1
        arrays = [param, grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq")]
        in_place = [a for i, a in enumerate(arrays) if a is not None and i != 1]
        runner = self._kernel_runner(arrays)
        if runner is not None:  # one launch instead of about a dozen (the GPU, or the CPU emulation)
            arrays[1] = xp.ascontiguousarray(grad)  # a transposed layer's gradient may be a strided view
            optim_kernels.adam_step(*arrays, state["step"], self.lr, self.betas, self.eps, self.weight_decay,
                                    self.decoupled_decay, runner=runner)
        elif xp is np and all(a.flags.c_contiguous for a in in_place):
            # The same elementwise arithmetic on flat chunks small enough that the update's
            # temporary stays in the core's cache, one range per core (the whole-array update makes several
            # parameter-sized temporaries, each a pass through memory).
            flat = [None if a is None else a.reshape(-1) for a in arrays]

            def run(start, stop):
                for low in range(start, stop, self.chunk):
                    high = min(stop, low + self.chunk)
                    self._update_slice(*[None if a is None else a[low:high] for a in flat], state["step"])

            over_slices(param.size, run, param.nbytes * 4)
        else:
            self._update_slice(*arrays, state["step"])

    @staticmethod
    def _kernel_runner(arrays):
        """The runner of the fused update kernel for these arrays, or None (the array formulation):
        the kernel takes float32/float64 arrays of one dtype, updated in place, so C-contiguous
        (all but the gradient, which is read only and copied when it is a strided view)."""
        present = [a for a in arrays if a is not None]
        if not kernel_launch.has_kernels_for(present[0].dtype) or any(a.dtype != present[0].dtype for a in present) \
                or not all(a.flags.c_contiguous for k, a in enumerate(arrays) if a is not None and k != 1):
            return None
        return kernel_launch.kernel_runner_for(present[0])

    def _update_slice(self, param, grad, m, v, max_v, t):
        """Adam's update, in place, on matching slices of the parameter, gradient and moments."""
        xp = backend.array_module(param)
        beta1, beta2 = self.betas
        if self.weight_decay:
            if self.decoupled_decay:
                param *= 1 - self.lr * self.weight_decay
            else:
                grad = grad + self.weight_decay * param
        scratch = xp.empty_like(m)  # one temporary in the moments' dtype, reused by every step below
        xp.multiply(grad, 1 - beta1, out=scratch)
        m *= beta1
        m += scratch
        xp.multiply(grad, 1 - beta2, out=scratch)
        scratch *= grad
        v *= beta2
        v += scratch
        if self.amsgrad:
            xp.maximum(max_v, v, out=max_v)
            v = max_v
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** t)
        step_size = self.lr / (1 - beta1 ** t)
        denom = xp.sqrt(v, out=scratch)
        denom /= bias_correction2_sqrt
        denom += self.eps
        update = xp.divide(m, denom, out=scratch)
        update *= step_size
        param -= update


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): param *= 1 - lr * weight_decay first."""

    decoupled_decay = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False,
                 capturable=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         capturable=capturable)
