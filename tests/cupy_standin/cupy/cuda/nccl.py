"""``cupy.cuda.nccl`` of the CPU stand-in: a communicator of one rank.

A collective over one rank copies (or leaves) the data, so what is checked is what NCCL would
read: every pointer points into a live array on the communicator's GPU, ``count`` values of
``datatype`` fit in it from there on, and the stream is a stream's handle."""
import ctypes
import os

from .. import _allocation_of, _current_device

available = True
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_ITEMSIZE = {NCCL_INT8: 1, NCCL_UINT8: 1, NCCL_INT32: 4, NCCL_UINT32: 4, NCCL_INT64: 8, NCCL_UINT64: 8,
             NCCL_FLOAT16: 2, NCCL_FLOAT32: 4, NCCL_FLOAT64: 8}


class NcclError(RuntimeError):
    pass


def get_unique_id():
    return tuple(os.urandom(128))


def get_version():
    return 22800


class NcclCommunicator:
    def __init__(self, ndev, commId, rank):
        if ndev != 1 or rank != 0:
            raise NcclError(f"the stand-in's NCCL has one rank, asked for rank {rank} of {ndev}")
        if not isinstance(commId, tuple) or len(commId) != 128:
            raise NcclError("commId must be get_unique_id()'s tuple")
        self.device_id = _current_device()
        self._alive = True

    def _check(self, name, pointer, count, datatype, stream):
        if not self._alive:
            raise NcclError(f"{name} on a destroyed communicator")
        if datatype not in _ITEMSIZE:
            raise NcclError(f"{name}: unknown datatype {datatype}")
        if not isinstance(stream, int):
            raise TypeError(f"{name}: stream must be a stream's ptr (int), got {type(stream)}")
        found = _allocation_of(pointer)
        if found is None:
            raise NcclError(f"{name}: pointer {pointer:#x} is in no live array")
        device, start, nbytes = found
        if device != self.device_id:
            raise NcclError(f"{name}: the buffer is on GPU {device}, the communicator on GPU {self.device_id}")
        if pointer + count * _ITEMSIZE[datatype] > start + nbytes:
            raise NcclError(f"{name}: {count} values of {_ITEMSIZE[datatype]} bytes run past the end of the array")

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        if op not in (NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN):
            raise NcclError(f"allReduce: unknown op {op}")
        self._check("allReduce", sendbuf, count, datatype, stream)
        self._check("allReduce", recvbuf, count, datatype, stream)
        if sendbuf != recvbuf:  # one rank: the reduction of one value is that value
            ctypes.memmove(recvbuf, sendbuf, count * _ITEMSIZE[datatype])

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream):
        if root != 0:
            raise NcclError(f"broadcast: root {root} of a one-rank communicator")
        self.allReduce(sendbuf, recvbuf, count, datatype, NCCL_SUM, stream)

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)

    def rank_id(self):
        return 0

    def size(self):
        return 1

    def destroy(self):
        self._alive = False

    def abort(self):
        self._alive = False


__all__ = [name for name in dir() if name.startswith("NCCL_")] + ["NcclCommunicator", "get_unique_id", "available"]
