"""Data-parallel training across processes, GPUs and hosts, on MPI (mpi4py) and NCCL (CuPy).

    mpirun -n 4 python train.py          # every process runs the same script

    import tinygrad_caps.distributed as dist
    dist.init()                                       # "auto": NCCL for CUDA models, MPI otherwise
    model = dist.DistributedDataParallel(model)       # rank 0's weights everywhere
    loader = BatchIterator(images, labels, 128, shuffle=True, shard=(dist.rank(), dist.world_size()))
    ...  loss.backward()  # every .grad is now the mean over the ranks

Importing this module imports neither mpi4py nor CuPy; a process started without ``mpirun`` is a
group of one (rank 0, world size 1) in which every collective is the identity.
"""
from ..errors import DistributedSetupError
from .ddp import DistributedDataParallel
from .process_group import (abort, all_gather_object, all_reduce, barrier, broadcast, broadcast_object, finalize,
                            get_backend, init, is_initialized, launched_by_mpi, launcher_rank, launcher_world_size,
                            local_rank, rank, world_size)
from .sync_batchnorm import SyncBatchNorm, all_reduce_sum, convert_sync_batchnorm, sync_batch_norm

__all__ = [
    "DistributedDataParallel", "DistributedSetupError", "SyncBatchNorm", "abort", "all_gather_object", "all_reduce", "all_reduce_sum",
    "barrier", "broadcast", "broadcast_object", "convert_sync_batchnorm", "finalize", "get_backend", "init",
    "is_initialized", "launched_by_mpi", "launcher_rank", "launcher_world_size", "local_rank", "rank",
    "sync_batch_norm", "world_size",
]
