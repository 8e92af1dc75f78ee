"""``cupy.cuda.nccl`` of the CPU stand-in.

One rank: a collective copies (or leaves) the data. Several ranks (processes under ``mpirun``,
one stand-in GPU each): the communicator runs its collectives through MPI (mpi4py) on the host
memory behind the pointers. Either way what is checked is what NCCL would read or need: every
pointer points into a live array on the communicator's GPU, ``count`` values of ``datatype`` fit
in it from there on, the stream is a stream's handle, every rank was given the same unique id
(NCCL would hang otherwise), the ranks are 0..n-1 once each, and no two ranks of a host share a
GPU (NCCL refuses that). A collective on the null stream runs at once; on another stream it
runs when something waits for that stream (see ``cupy.cuda.Stream``), and its buffers must still
be live then."""
import ctypes
import os
import socket

import numpy

from .. import _allocation_of, _current_device
from . import _streams, stream_of

available = True
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_DTYPE = {NCCL_INT8: numpy.int8, NCCL_UINT8: numpy.uint8, NCCL_INT32: numpy.int32, NCCL_UINT32: numpy.uint32,
          NCCL_INT64: numpy.int64, NCCL_UINT64: numpy.uint64, NCCL_FLOAT16: numpy.float16,
          NCCL_FLOAT32: numpy.float32, NCCL_FLOAT64: numpy.float64}
_ITEMSIZE = {datatype: numpy.dtype(dtype).itemsize for datatype, dtype in _DTYPE.items()}


class NcclError(RuntimeError):
    pass


def get_unique_id():
    return tuple(os.urandom(128))


def get_version():
    return 22800


class NcclCommunicator:
    def __init__(self, ndev, commId, rank):
        if not isinstance(commId, tuple) or len(commId) != 128:
            raise NcclError("commId must be get_unique_id()'s tuple")
        if not 0 <= rank < ndev:
            raise NcclError(f"rank {rank} is not in 0..{ndev - 1}")
        self.device_id = _current_device()
        self._mpi = None
        if ndev > 1:
            self._join(ndev, commId, rank)
        self._rank, self._size = rank, ndev
        self._alive = True

    def _join(self, ndev, commId, rank):
        """The MPI side of a communicator of ``ndev`` processes, with NCCL's conditions checked."""
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise NcclError(f"the stand-in's NCCL runs {ndev} ranks through MPI, and mpi4py is missing") from exc
        if MPI.COMM_WORLD.Get_size() != ndev:
            raise NcclError(f"the stand-in's NCCL needs one MPI process per rank: {ndev} ranks, "
                            f"{MPI.COMM_WORLD.Get_size()} processes")
        members = MPI.COMM_WORLD.allgather((commId, rank, socket.gethostname(), self.device_id))
        if any(other[0] != commId for other in members):
            raise NcclError("the ranks were given different unique ids (NCCL would wait forever)")
        if sorted(other[1] for other in members) != list(range(ndev)):
            raise NcclError(f"the ranks are {[other[1] for other in members]}, not 0..{ndev - 1} once each")
        places = [(host, device) for _, _, host, device in members]
        if len(set(places)) != ndev:
            raise NcclError(f"two ranks share a GPU on one host ({places}); NCCL refuses that")
        # ordered by NCCL rank, so that a root names the same process on every rank
        self._mpi = MPI.COMM_WORLD.Split(0, rank)
        self._ops = {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}
        self._in_place = MPI.IN_PLACE

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

    def _values(self, pointer, count, datatype):
        """The ``count`` values at ``pointer``, as a NumPy array over that memory."""
        raw = (ctypes.c_char * (count * _ITEMSIZE[datatype])).from_address(pointer)
        return numpy.frombuffer(raw, dtype=_DTYPE[datatype])

    def _live(self, name, pointer):
        if _allocation_of(pointer) is None:
            raise NcclError(f"{name}: the buffer at {pointer:#x} was freed before the collective ran")

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        if op not in (NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN):
            raise NcclError(f"allReduce: unknown op {op}")
        self._check("allReduce", sendbuf, count, datatype, stream)
        self._check("allReduce", recvbuf, count, datatype, stream)

        def run():
            self._live("allReduce", sendbuf)
            self._live("allReduce", recvbuf)
            if self._mpi is not None:
                recv = self._values(recvbuf, count, datatype)
                send = self._in_place if sendbuf == recvbuf else self._values(sendbuf, count, datatype)
                self._mpi.Allreduce(send, recv, op=self._ops[op])
            elif sendbuf != recvbuf:  # one rank: the reduction of one value is that value
                ctypes.memmove(recvbuf, sendbuf, count * _ITEMSIZE[datatype])

        stream_of(stream)._enqueue(run)

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream):
        if not 0 <= root < self._size:
            raise NcclError(f"broadcast: root {root} of a communicator of {self._size} ranks")
        self._check("broadcast", recvbuf, count, datatype, stream)
        if self._rank == root:
            self._check("broadcast", sendbuf, count, datatype, stream)

        def run():
            self._live("broadcast", recvbuf)
            if self._rank == root and sendbuf != recvbuf:
                ctypes.memmove(recvbuf, sendbuf, count * _ITEMSIZE[datatype])
            if self._mpi is not None:
                self._mpi.Bcast(self._values(recvbuf, count, datatype), root=root)

        stream_of(stream)._enqueue(run)

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def destroy(self):
        # NCCL finishes what was enqueued before it frees the communicator
        for stream in list(_streams.values()):
            stream.synchronize()
        self._alive = False
        if self._mpi is not None:
            self._mpi.Free()
            self._mpi = None

    def abort(self):
        self.destroy()


__all__ = [name for name in dir() if name.startswith("NCCL_")] + ["NcclCommunicator", "get_unique_id", "available"]
