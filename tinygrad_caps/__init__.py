"""tinygrad-caps: a small tape-based reverse-mode autodiff engine on NumPy (CPU) and CuPy (GPU).

    import tinygrad_caps as tc
    import tinygrad_caps.functional as F
"""
from . import _allocator  # noqa: F401  (tunes glibc malloc for large temporaries; see its docstring)
from .autograd import detect_anomaly, enable_grad, grad, is_grad_enabled, no_grad, set_grad_enabled
from .backend import default_device, gpu_available
from .errors import AnomalyError, CheckpointError, DeviceError, GraphError, ShapeError, StateDictError
from .random import manual_seed
from .tensor import Tensor, as_tensor, get_default_dtype, set_default_dtype, tensor
from .factories import arange, full, ones, ones_like, rand, randn, zeros, zeros_like
from . import functional, nn, optim, gradcheck  # noqa: E402
from .serialization import load, save

__version__ = "0.1.0"

__all__ = [
    "AnomalyError", "CheckpointError", "DeviceError", "GraphError", "ShapeError", "StateDictError", "Tensor",
    "arange", "as_tensor", "default_device", "detect_anomaly", "enable_grad", "full", "functional",
    "get_default_dtype", "gpu_available", "grad", "gradcheck", "is_grad_enabled", "load", "manual_seed", "nn",
    "no_grad", "ones", "ones_like", "optim", "rand", "randn", "save", "set_default_dtype", "set_grad_enabled",
    "tensor", "zeros", "zeros_like",
]
