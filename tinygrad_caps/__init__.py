"""tinygrad-caps: a small tape-based reverse-mode autodiff engine on NumPy (CPU) and CuPy (GPU).

    import tinygrad_caps as tc
    import tinygrad_caps.functional as F
"""
try:  # the install maps the top-level folders kernels/ and models/ into this package
    from .kernels import device as _kernel_device  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != f"{__name__}.kernels":
        raise
    raise ImportError(f"{__name__}.kernels is missing: the package is not installed, and only the install maps the "
                      "repository's kernels/ and models/ folders into it; from the repository root, run: "
                      "pip install -e .") from None
from ._allocator import tune_allocator
from .autograd import (detect_anomaly, enable_grad, grad, is_anomaly_enabled, is_grad_enabled, no_grad,
                       set_grad_enabled)
from .backend import default_device, gpu_available
from .errors import (AnomalyError, CheckpointError, DeviceError, DistributedSetupError, GraphError, ShapeError,
                     StateDictError)
from .random import manual_seed
from .tensor import Tensor, as_tensor, get_default_dtype, set_default_dtype, tensor
from .factories import arange, full, ones, ones_like, rand, randn, zeros, zeros_like
from . import functional, nn, optim, gradcheck  # noqa: E402
from . import distributed  # noqa: E402  (imports neither mpi4py nor CuPy)
from .autograd_functional import hessian, hvp, jacobian, jvp, vjp  # noqa: E402
from .profiler import profile  # noqa: E402
from .serialization import load, save
from .ops.linalg import get_matmul_precision, set_matmul_precision  # noqa: E402
from . import cuda_graphs  # noqa: E402  (imports CuPy only when a step is captured)
from .dlpack import from_dlpack  # noqa: E402
from . import graph  # noqa: E402
from .kernels import moved as _moved  # noqa: E402

# module paths before a move (CHANGELOG.md): they import with a DeprecationWarning, and go in 0.2
_moved.install(__name__, {"datasets": "data"})

__version__ = "0.1.0"

__all__ = [
    "AnomalyError",
    "CheckpointError",
    "DeviceError",
    "DistributedSetupError",
    "GraphError",
    "ShapeError",
    "StateDictError",
    "Tensor",
    "arange",
    "cuda_graphs",
    "as_tensor",
    "default_device",
    "detect_anomaly",
    "distributed",
    "enable_grad",
    "from_dlpack",
    "full",
    "functional",
    "get_default_dtype",
    "get_matmul_precision",
    "gpu_available",
    "grad",
    "graph",
    "gradcheck",
    "hessian",
    "hvp",
    "is_anomaly_enabled",
    "is_grad_enabled",
    "jacobian",
    "jvp",
    "load",
    "manual_seed",
    "nn",
    "no_grad",
    "ones",
    "ones_like",
    "optim",
    "profile",
    "rand",
    "randn",
    "save",
    "set_default_dtype",
    "set_grad_enabled",
    "set_matmul_precision",
    "tensor",
    "tune_allocator",
    "vjp",
    "zeros",
    "zeros_like",
]
