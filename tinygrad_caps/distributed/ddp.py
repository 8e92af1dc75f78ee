"""DistributedDataParallel: one model replica per rank, gradients averaged in buckets during backward.

Parameters are grouped into buckets of about ``bucket_mb`` megabytes, in reverse registration
order (the order in which backward usually finishes them). A hook that fires when a parameter's
gradient is complete marks it ready; when every parameter of a bucket is ready, the bucket is
flattened into one buffer and its all-reduce starts (MPI ``Iallreduce`` for NumPy, NCCL on a
communication stream for CuPy) while backward goes on with the earlier layers. Buckets start
strictly in index order, so every rank issues the same collectives in the same order even if
hooks fire in another order. The hook that completes the last bucket waits for all of them and
writes the averages back into ``.grad``: when ``loss.backward()`` returns, every gradient is the
mean over ranks.
"""
from __future__ import annotations

import contextlib

from .. import backend
from ..nn.module import Module
from ..tensor import Tensor
from . import process_group as group


class _Bucket:
    """Parameters (same dtype and device) whose gradients travel in one all-reduce."""

    def __init__(self, index, params, names):
        self.index, self.params, self.names = index, params, names
        self.dtype = params[0].dtype
        self.sizes = [p.size for p in params]
        self.numel = sum(self.sizes)
        self.ready = set()

    def is_ready(self) -> bool:
        return len(self.ready) == len(self.params)

    def flatten(self):
        first = self.params[0].grad.data
        xp = backend.array_module(first)
        flat = xp.empty(self.numel, dtype=self.dtype)
        offset = 0
        for p, n in zip(self.params, self.sizes):
            flat[offset:offset + n] = p.grad.data.reshape(-1)
            offset += n
        return flat

    def unflatten_into_grads(self, flat):
        offset = 0
        for p, n in zip(self.params, self.sizes):
            p.grad = Tensor._wrap(flat[offset:offset + n].reshape(p.shape))
            offset += n


class DistributedDataParallel(Module):
    """Wrap ``module`` for data-parallel training over the ranks of ``tinygrad_caps.distributed``.

    Args:
        module: the model (every rank builds it the same way); rank 0's parameters and buffers
            are broadcast to all ranks here.
        bucket_mb: about how many megabytes of gradients each all-reduce carries.
    Calling the wrapper calls ``module``. ``state_dict()`` and ``load_state_dict()`` use the
    module's own keys (no ``module.`` prefix), so a checkpoint moves freely between a
    distributed and a single-process run. Every parameter that requires grad must take part in
    each loss (as with PyTorch's default); one that got no gradient is reported at the next forward.
    BatchNorm statistics stay per rank (see ``convert_sync_batchnorm`` for global ones).
    """

    def __init__(self, module: Module, bucket_mb: float = 25):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: expected a Module, got {type(module).__name__}")
        if not bucket_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_mb must be positive, got {bucket_mb}")
        group._check_usable("DistributedDataParallel")
        self.module = module
        self.bucket_mb = float(bucket_mb)
        self._sync = True
        self._launched = []   # (bucket, flat buffer, request or CUDA event)
        self._next_bucket = 0
        self._comm = None
        self._stream = None
        self._grad_hook_handles = []
        self._broadcast_state()
        self.buckets = self._make_buckets()
        # Started by mpirun, or on NCCL: hooks even in a group of one, so that one GPU exercises the NCCL path.
        if group.mpi_comm() is not None or group.get_backend() == "nccl":
            self._register_hooks()

    # ----- construction -----
    def _broadcast_state(self):
        for _, p in self.module.named_parameters():
            group.broadcast(p.data)
        for _, b in self.module.named_buffers():
            group.broadcast(b.data if isinstance(b, Tensor) else b)

    def _make_buckets(self):
        limit = self.bucket_mb * 2 ** 20
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        buckets, params, names, nbytes, key = [], [], [], 0, None
        for name, p in reversed(named):
            p_key = (p.dtype, p.device)
            if params and (p_key != key or nbytes + p.data.nbytes > limit):
                buckets.append(_Bucket(len(buckets), params, names))
                params, names, nbytes = [], [], 0
            params.append(p)
            names.append(name)
            nbytes += p.data.nbytes
            key = p_key
        if params:
            buckets.append(_Bucket(len(buckets), params, names))
        return buckets

    def _register_hooks(self):
        if group.mpi_comm() is not None:
            # A communicator of its own (for CPU gradients), so its all-reduces never interleave with other collectives.
            self._comm = group.mpi_comm().Dup()
        for bucket in self.buckets:
            for position, p in enumerate(bucket.params):
                self._grad_hook_handles.append(p.register_post_accumulate_grad_hook(self._hook_for(bucket, position)))

    def _hook_for(self, bucket, position):
        def hook(param):
            if not self._sync:
                return
            bucket.ready.add(position)
            self._progress()
            self._launch_ready_buckets()
        return hook

    # ----- the reduction -----
    def _launch_ready_buckets(self):
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].is_ready():
            bucket = self.buckets[self._next_bucket]
            flat = bucket.flatten()
            self._launched.append((bucket, flat, self._start_all_reduce(flat)))
            self._next_bucket += 1
        if self._next_bucket == len(self.buckets):
            self._finish()

    def _start_all_reduce(self, flat):
        if backend.is_cupy_array(flat):
            return self._start_nccl(flat)
        if self._comm is None:  # a group of one outside MPI: nothing to add
            return None
        from mpi4py import MPI

        return self._comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM)

    def _start_nccl(self, flat):
        cp = backend.cupy_module()
        if self._stream is None:
            self._stream = cp.cuda.Stream(non_blocking=True)
        filled = cp.cuda.Event(disable_timing=True)
        filled.record(cp.cuda.get_current_stream())
        self._stream.wait_event(filled)  # the flat copy is complete before NCCL reads it
        group.nccl_all_reduce(flat, "sum", stream=self._stream)
        done = cp.cuda.Event(disable_timing=True)
        done.record(self._stream)
        return done

    def _progress(self):
        """Let MPI advance the all-reduces already started (it progresses inside MPI calls)."""
        for _, flat, request in self._launched:
            if request is not None and not backend.is_cupy_array(flat):
                request.Test()

    @staticmethod
    def _wait(flat, request):
        """Wait for one bucket's all-reduce: the current stream waits for NCCL's event (GPU), or
        MPI's request completes (CPU)."""
        if backend.is_cupy_array(flat):
            backend.cupy_module().cuda.get_current_stream().wait_event(request)
        elif request is not None:
            request.Wait()

    def _finish(self):
        world = group.world_size()
        for bucket, flat, request in self._launched:
            self._wait(flat, request)
            flat /= world
            bucket.unflatten_into_grads(flat)
        self._reset()

    def _reset(self):
        for bucket in self.buckets:
            bucket.ready.clear()
        self._launched.clear()
        self._next_bucket = 0

    def check_all_reduced(self) -> None:
        """Raise RuntimeError, naming them, if parameters that require grad got no gradient in the
        last backward (their buckets were never averaged). ``forward`` calls it; a loop that calls
        the wrapped module itself calls it after each backward."""
        if self._launched or any(bucket.ready for bucket in self.buckets):
            # launched buckets are complete; the others name the parameters that got no gradient
            missing = [name for bucket in self.buckets[self._next_bucket:] for k, name in enumerate(bucket.names)
                       if k not in bucket.ready]
            # finish what was started, so no rank is left waiting (and NCCL writes no freed buffer)
            for _, flat, request in self._launched:
                self._wait(flat, request)
            self._reset()
            raise RuntimeError("DistributedDataParallel: the last backward gave no gradient to "
                               f"{', '.join(missing)}; every parameter that requires grad must take part in the loss")

    # ----- Module interface -----
    def forward(self, *args, **kwargs):
        """Call the wrapped module (checks that the previous backward reduced every gradient)."""
        self.check_all_reduced()
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Context in which backward only accumulates local gradients (for gradient accumulation);
        the first backward after it averages the accumulated sums."""
        previous = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = previous

    def state_dict(self):
        """The wrapped module's state_dict (its own keys, no ``module.`` prefix)."""
        return self.module.state_dict()

    def load_state_dict(self, state, strict: bool = True):
        """Load into the wrapped module (keys without the ``module.`` prefix)."""
        return self.module.load_state_dict(state, strict)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is None:
                raise
            return getattr(module, name)

    def extra_repr(self):
        return f"world_size={group.world_size()}, buckets={len(self.buckets)}, bucket_mb={self.bucket_mb}"
