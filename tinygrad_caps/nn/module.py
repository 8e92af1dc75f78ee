"""Module and Parameter: containers that find their parameters, move them, and save/load them."""
from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple

import numpy as np

from .. import backend
from ..errors import StateDictError
from ..tensor import Tensor

LoadResult = namedtuple("LoadResult", ["missing_keys", "unexpected_keys"])


class Parameter(Tensor):
    """A leaf Tensor that a Module registers as trainable (requires_grad=True by default)."""

    def __init__(self, data, dtype=None, device=None, requires_grad=True):
        super().__init__(data, dtype=dtype, device=device, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter(" + super().__repr__() + ")"


class Module:
    """Base class of layers and models: assign Parameters, Modules and buffers as attributes.

    Subclasses call ``super().__init__()`` first and define ``forward``; calling the module calls it.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())

    def _registries(self):
        try:
            return self.__dict__["_parameters"], self.__dict__["_modules"], self.__dict__["_buffers"]
        except KeyError:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() first") from None

    def __setattr__(self, name, value):
        params, modules, buffers = self._registries()
        for registry in (params, modules, buffers):
            registry.pop(name, None)
        if isinstance(value, Parameter):
            params[name] = value
        elif isinstance(value, Module):
            modules[name] = value
        elif name in buffers:
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name):
        for registry in ("_parameters", "_modules", "_buffers"):
            found = self.__dict__.get(registry)
            if found is not None and name in found:
                return found[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def register_buffer(self, name: str, value) -> None:
        """Register a non-trainable array or Tensor (running statistics) saved in the state_dict."""
        self._registries()[2][name] = value
        self.__dict__.pop(name, None)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward")

    def __call__(self, *args, **kwargs):
        for hook in list(self.__dict__.get("_forward_pre_hooks", {}).values()):
            replaced = hook(self, args)
            if replaced is not None:
                args = replaced if isinstance(replaced, tuple) else (replaced,)
        gpu = self._forward_gpu()
        if gpu is None:
            output = self.forward(*args, **kwargs)
        else:
            with gpu:
                output = self.forward(*args, **kwargs)
        for hook in list(self.__dict__.get("_forward_hooks", {}).values()):
            replaced = hook(self, args, output)
            if replaced is not None:
                output = replaced
        return output

    def _forward_gpu(self):
        """The GPU (a CuPy Device) holding this module's first parameter or buffer, made current
        while its forward runs: a forward that makes arrays itself (a label mask, routing logits,
        running statistics) makes them beside its state even when another GPU is current. None
        for a module on the CPU or without state."""
        params, modules, buffers = self._registries()
        for value in itertools.chain(params.values(), buffers.values()):
            array = value.data if isinstance(value, Tensor) else value
            if array is not None:
                return array.device if backend.is_cupy_array(array) else None
        for child in modules.values():
            if child is not None:
                gpu = child._forward_gpu()
                if gpu is not None:
                    return gpu
        return None

    def register_forward_pre_hook(self, hook) -> "RemovableHandle":
        """Call ``hook(module, inputs)`` before every ``forward`` (``inputs``: the positional arguments,
        a tuple); a non-None return (a tuple, or one value) replaces them. Hooks run in registration order.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        return RemovableHandle(self._hook_registry("_forward_pre_hooks"), hook)

    def register_forward_hook(self, hook) -> "RemovableHandle":
        """Call ``hook(module, inputs, output)`` after every ``forward``; a non-None return replaces the
        output. Hooks run in registration order, each seeing the output the previous one returned.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        return RemovableHandle(self._hook_registry("_forward_hooks"), hook)

    def _hook_registry(self, name):
        registry = self.__dict__.get(name)
        if registry is None:
            registry = OrderedDict()
            object.__setattr__(self, name, registry)
        return registry

    # ----- traversal -----
    def named_children(self):
        """(name, module) for each direct submodule."""
        return iter(self._registries()[1].items())

    def children(self):
        return (m for _, m in self.named_children())

    def named_modules(self, prefix: str = ""):
        """(dotted name, module) for this module and every submodule, depth first."""
        stack, seen = [(prefix, self)], set()
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = list(module.named_children())
            stack.extend((f"{name}.{child_name}" if name else child_name, child) for child_name, child in reversed(children))

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_parameters(self, prefix: str = ""):
        """(dotted name, Parameter) for every parameter, each once, in registration order."""
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, p in module._registries()[0].items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{module_name}.{name}" if module_name else name), p

    def parameters(self):
        return (p for _, p in self.named_parameters())

    def named_buffers(self):
        for module_name, module in self.named_modules():
            for name, b in module._registries()[2].items():
                if b is not None:
                    yield (f"{module_name}.{name}" if module_name else name), b

    # ----- modes and devices -----
    def train(self, mode: bool = True) -> "Module":
        """Set training mode (dropout, batch norm) on this module and all submodules; returns self."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop the gradients of every parameter."""
        for p in self.parameters():
            p.grad = None

    def to(self, device=None, dtype=None) -> "Module":
        """Move every parameter and buffer to ``device`` and/or cast floating ones to ``dtype``, in place."""
        device = None if device is None else backend.normalize_device(device)
        dtype = None if dtype is None else np.dtype(dtype)

        def convert(array):
            if dtype is not None and array.dtype.kind == "f":
                array = array.astype(dtype)
            return backend.to_device(array, device) if device is not None else array

        for p in self.parameters():
            p.data = convert(p.data)
            p.grad = None
            p._bump_version()
        for module in self.modules():
            buffers = module._registries()[2]
            for name, b in buffers.items():
                if isinstance(b, Tensor):
                    b.data = convert(b.data)
                elif b is not None:
                    buffers[name] = convert(b)
        return self

    # ----- state -----
    def state_dict(self) -> "OrderedDict[str, object]":
        """Dotted name -> array (the live NumPy/CuPy data) for every parameter and buffer."""
        state = OrderedDict((name, p.data) for name, p in self.named_parameters())
        for name, b in self.named_buffers():
            state[name] = b.data if isinstance(b, Tensor) else b
        return state

    def load_state_dict(self, state, strict: bool = True) -> LoadResult:
        """Copy arrays (or Tensors) from ``state`` into this module's parameters and buffers.

        Shape mismatches always raise; missing and unexpected keys raise when ``strict``. The
        error lists every offending key. Values are converted to each parameter's dtype and device.
        Returns (missing_keys, unexpected_keys).
        """
        targets = OrderedDict(self.named_parameters())
        buffer_owner = {}
        for module_name, module in self.named_modules():
            for name, b in module._registries()[2].items():
                buffer_owner[f"{module_name}.{name}" if module_name else name] = (module, name)
        own_keys = list(targets) + list(buffer_owner)
        missing = [k for k in own_keys if k not in state]
        unexpected = [k for k in state if k not in targets and k not in buffer_owner]
        mismatched = []
        for key in own_keys:
            if key in state:
                current = targets[key].data if key in targets else _buffer_array(*buffer_owner[key])
                incoming = state[key]
                if tuple(np.shape(incoming) if not hasattr(incoming, "shape") else incoming.shape) != tuple(current.shape):
                    mismatched.append(f"{key}: checkpoint {tuple(incoming.shape)} vs model {tuple(current.shape)}")
        problems = []
        if mismatched:
            problems.append("mis-shaped keys: " + "; ".join(mismatched))
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if problems:
            raise StateDictError(f"load_state_dict into {type(self).__name__}: " + " | ".join(problems))
        for key in own_keys:
            if key not in state:
                continue
            value = state[key].data if isinstance(state[key], Tensor) else state[key]
            if key in targets:
                p = targets[key]
                p.data = _converted_like(value, p.data)
                p._bump_version()
            else:
                module, name = buffer_owner[key]
                buffer = module._registries()[2][name]
                if isinstance(buffer, Tensor):
                    buffer.data = _converted_like(value, buffer.data)
                    buffer._bump_version()
                else:
                    module._registries()[2][name] = _converted_like(value, buffer)
        return LoadResult(missing, unexpected)

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self.named_children():
            lines.append(f"  ({name}): " + repr(child).replace("\n", "\n  "))
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"

    def extra_repr(self) -> str:
        return ""


class RemovableHandle:
    """What ``register_forward_hook`` / ``register_forward_pre_hook`` return: ``remove()`` unregisters
    the hook (a second ``remove()`` does nothing)."""

    _next_id = 0

    def __init__(self, registry, hook):
        self._registry, self.id = registry, RemovableHandle._next_id
        RemovableHandle._next_id += 1
        registry[self.id] = hook

    def remove(self) -> None:
        self._registry.pop(self.id, None)


def _buffer_array(module, name):
    b = module._registries()[2][name]
    return b.data if isinstance(b, Tensor) else b


def _converted_like(value, like):
    xp = backend.array_module(like)
    if backend.device_of(like).startswith("cuda"):
        with backend.on_device_of(like):
            return xp.array(value, dtype=like.dtype)
    return np.array(backend.to_numpy(value), dtype=like.dtype)
