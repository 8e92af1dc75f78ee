"""Where the time goes, per op: ``with tc.profile() as prof: ...; print(prof.table())``.

For each op class the profile counts calls and wall time spent in forward and in backward, and the
bytes of the arrays the op created (its forward outputs, and the gradients its backward returned).

- Forward time is that of ops called from user code; the ops that a backward runs are part of that
  node's backward time (not counted again as forward calls), so the columns add up to the walk.
  The walk's own work, summing the gradients that reach a tensor by several paths (and building
  deferred ones), is the row ``(gradient sums)``.
- On CUDA, work is asynchronous: with ``cuda_sync=True`` the current stream is synchronized before
  and after each op, so the times are those of the work, not of the launches.
- A profile records the ops of the thread that entered it (grad mode is thread-local too).
"""
from __future__ import annotations

import time

from .autograd.deferred import DeferredGradient
from .autograd.observers import GRADIENT_SUMS, Observer, start_observing, stop_observing
from .backend import cupy_module, is_cupy_array


def _new_bytes(array, sources) -> int:
    """Bytes of ``array`` unless it is a view of one of ``sources`` (then it allocated nothing)."""
    base = getattr(array, "base", None)
    if base is not None and any(base is a or base is getattr(a, "base", None) for a in sources):
        return 0
    return int(getattr(array, "nbytes", 0))


class Profile(Observer):
    """A context that records per-op calls, forward and backward seconds, and bytes created: an
    observer of the tape (``tinygrad_caps.autograd.Observer``) of the thread that entered it."""

    def __init__(self, cuda_sync: bool = False):
        self.cuda_sync = bool(cuda_sync)
        self.records: dict[str, dict] = {}
        self._previous = None

    def __enter__(self):
        self._previous = start_observing(self)
        return self

    def __exit__(self, *exc):
        stop_observing(self._previous)
        return False

    # ----- told by the tape -----
    def forward_recorded(self, fn, inputs, output, start):
        self.record_forward(fn.name, start, output.data, [x.data for x in inputs])

    def node_backward(self, fn, grad_output, grads, start):
        self.record_backward(fn.name, start, grads, grad_output)

    def gradient_summed(self, result, start, created):
        self.record_gradient_sum(GRADIENT_SUMS, start, result, created)

    def clock(self, arrays=()) -> float:
        """The time now, after the GPUs holding ``arrays`` finished their queued work if ``cuda_sync``."""
        if self.cuda_sync:
            for device_id in {a.device.id for a in arrays if is_cupy_array(a)}:
                with cupy_module().cuda.Device(device_id):  # that GPU's current stream, not this one's
                    cupy_module().cuda.get_current_stream().synchronize()
        return time.perf_counter()

    def _entry(self, name):
        entry = self.records.get(name)
        if entry is None:
            entry = self.records[name] = {"calls": 0, "forward_s": 0.0, "backward_s": 0.0, "bytes": 0}
        return entry

    def record_forward(self, name: str, start: float, output, inputs=()) -> None:
        end = self.clock((output,))
        entry = self._entry(name)
        entry["calls"] += 1
        entry["forward_s"] += end - start
        entry["bytes"] += _new_bytes(output, inputs)

    def record_backward(self, name: str, start: float, grads, grad_output=None) -> None:
        # A deferred gradient has created no array yet.
        arrays = [g.data for g in grads if g is not None and not isinstance(g, DeferredGradient)]
        end = self.clock(arrays)
        entry = self._entry(name)
        entry["backward_s"] += end - start
        entry["bytes"] += sum(_new_bytes(a, (grad_output,)) for a in arrays)

    def record_gradient_sum(self, name: str, start: float, result, created: bool) -> None:
        """One sum of the walk into a tensor's gradient, or one deferred gradient built: a call of
        the row ``name``, with the bytes of ``result`` if it is a new array (``created``)."""
        arrays = () if isinstance(result, DeferredGradient) else (result.data,)
        end = self.clock(arrays)
        entry = self._entry(name)
        entry["calls"] += 1
        entry["backward_s"] += end - start
        if created:
            entry["bytes"] += sum(int(getattr(a, "nbytes", 0)) for a in arrays)

    # ----- reports -----
    def totals(self) -> dict:
        """``{op_name: {"calls": int, "forward_s": float, "backward_s": float, "bytes": int}}`` (a copy)."""
        return {name: dict(entry) for name, entry in self.records.items()}

    def table(self, sort_by: str = "total", top: int = 20) -> str:
        """A printable table of the ``top`` ops, sorted by ``total`` (forward + backward seconds),
        ``forward``, ``backward``, ``calls`` or ``bytes`` (largest first), with a total line."""
        keys = {"total": lambda e: e["forward_s"] + e["backward_s"], "forward": lambda e: e["forward_s"],
                "backward": lambda e: e["backward_s"], "calls": lambda e: e["calls"], "bytes": lambda e: e["bytes"]}
        if sort_by not in keys:
            raise ValueError(f"Profile.table: sort_by must be one of {sorted(keys)}, got {sort_by!r}")
        if top < 1:
            raise ValueError(f"Profile.table: top must be positive, got {top}")
        rows = sorted(self.records.items(), key=lambda item: keys[sort_by](item[1]), reverse=True)
        total_s = sum(e["forward_s"] + e["backward_s"] for e in self.records.values()) or 1.0
        header = f"{'op':<22}{'calls':>8}{'forward s':>12}{'backward s':>12}{'total s':>10}{'share':>8}{'MB':>10}"
        lines = [header, "-" * len(header)]
        for name, e in rows[:top]:
            both = e["forward_s"] + e["backward_s"]
            lines.append(f"{name:<22}{e['calls']:>8}{e['forward_s']:>12.4f}{e['backward_s']:>12.4f}{both:>10.4f}"
                         f"{both / total_s:>8.1%}{e['bytes'] / 1e6:>10.1f}")
        sums = {k: sum(e[k] for e in self.records.values()) for k in ("calls", "forward_s", "backward_s", "bytes")}
        lines.append("-" * len(header))
        lines.append(f"{'total':<22}{sums['calls']:>8}{sums['forward_s']:>12.4f}{sums['backward_s']:>12.4f}"
                     f"{sums['forward_s'] + sums['backward_s']:>10.4f}{'':>8}{sums['bytes'] / 1e6:>10.1f}")
        return "\n".join(lines)


def profile(cuda_sync: bool = False) -> Profile:
    """``with tc.profile() as prof:`` records every op of this thread; see :class:`Profile`."""
    return Profile(cuda_sync=cuda_sync)
