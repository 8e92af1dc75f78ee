"""Per-iteration statistics of a RoutingTrace: how polarized the coupling coefficients are, how the
output capsules differ across the batch, how well predictions agree with outputs, and how much
gradient reaches u_hat through each iteration and path.

Peer et al. (2019) define the T-score (1 - normalized coupling entropy; 0 uniform, 1 one-hot) and
the D-score (how much output capsule lengths vary over the batch); Paik et al. (2019) follow the
polarization of the coupling coefficients over iterations.

As their authors define them:
- the entropy and the T-score are computed in float64 on the couplings renormalised to sum to 1
  over the output capsules (the leaky routing's rows sum to less), so an exactly uniform coupling
  gives T = 0 and a one-hot coupling T = 1 at any float dtype; deviations from uniform that the
  couplings' own dtype cannot represent give T below ``t_score_resolution(dtype, J)`` (about 3e-15
  in float32), which is rounding, not routing;
- every routing layer has its own T and D (``routing_statistics`` of its trace); the network's T
  is the mean over the routing layers of their last iteration's T, and its D-score is the D of the
  hidden capsule layers (``network_scores``): Peer et al. take D on the hidden layer because
  DigitCaps' lengths are forced by the margin loss, so DigitCaps' D (``digit_d_score``) is not
  comparable to theirs;
- D is taken on a layer's class scores: the output activations where its routing has them (EM
  routing, self-routing: ``trace.activations``; their pose lengths are not what the model reads),
  else the lengths of the output capsules. Each layer says which (``d_score_source``: "activations"
  or "lengths"; "d_score_from" in the gradient-flow report and ``gradflow.jsonl``).
"""
from __future__ import annotations

import functools
import math

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps.backend import array_module, is_cupy_array, on_device_of, to_numpy
from tinygrad_caps.tensor import Tensor

_EPS = 1e-12


def __getattr__(name):
    """``STATISTICS``: the names of the per-iteration statistics (``figures.iteration_figures()``), in
    the order of ``routing_statistics``' keys; registered figures included."""
    if name == "STATISTICS":
        from .figures import iteration_figures  # (figures.py builds on this module's functions)

        return tuple(figure.name for figure in iteration_figures())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _values(t) -> np.ndarray:
    """A float64 NumPy copy of a Tensor's (or array's) values (for the small (B, I, J) and (B, J, D) ones)."""
    return np.asarray(to_numpy(t.data if isinstance(t, Tensor) else t), dtype=np.float64)


def _native(t):
    """A Tensor's (or array's) NumPy/CuPy data as it is: u_hat-sized arrays are read in place, not copied."""
    if isinstance(t, Tensor):
        return t.data
    return t if is_cupy_array(t) else np.asarray(t)


def _array_key(array) -> tuple:
    """(address, shape, strides, dtype): equal for two views of the same memory, read the same way."""
    address = array.__array_interface__["data"][0] if isinstance(array, np.ndarray) else array.data.ptr
    return address, tuple(array.shape), tuple(array.strides), array.dtype.str


def prediction_lengths(u_hat):
    """|u_hat[b, i, j]| (B, I, J), on u_hat's device and in its dtype."""
    u = _native(u_hat)
    xp = array_module(u)
    with on_device_of(u):
        return xp.sqrt(xp.einsum("bijd,bijd->bij", u, u))


def t_score(c) -> float:
    """Peer et al.'s T-score of couplings c (B, I, J): the mean over (b, i) of 1 - H(p) / log J, where
    p = c[b, i, :] / sum_j c[b, i, j], computed in float64; 0 for a uniform row, 1 for a one-hot one.

    Each row's T is sum_j p_j log(c_j J / S) / log J (S the row's sum), at least 0 (a negative
    value is rounding); a row of equal values is 0 and a row with one non-zero entry 1, exactly.
    """
    c = _native(c)
    if c.ndim != 3:
        raise ValueError(f"t_score: expected c (B, I, J), got shape {c.shape}")
    outputs = c.shape[-1]
    if outputs < 2:
        return 1.0  # with one output capsule the coupling is always one-hot
    xp = array_module(c)
    with on_device_of(c):
        c = c.astype(np.float64)
        total = c.sum(axis=-1, keepdims=True)
        ratio = c * outputs / total
        # p log(p J) -> 0 as p -> 0: the log of the zero entries is taken at 1 and multiplied by 0.
        rows = xp.maximum((c / total * xp.log(xp.where(c > 0, ratio, 1.0))).sum(axis=-1) / math.log(outputs), 0.0)
        rows = xp.where(c.max(axis=-1) == c.min(axis=-1), 0.0, rows)
        rows = xp.where((c > 0).sum(axis=-1) == 1, 1.0, rows)
        return float(rows.mean())


def coupling_entropy(c) -> float:
    """Mean over (b, i) of H(p) / log J for couplings c (B, I, J) renormalised to p summing to 1
    (float64): 1 uniform, 0 one-hot; 1 - ``t_score(c)``."""
    c = _native(c)
    if c.ndim != 3:
        raise ValueError(f"coupling_entropy: expected c (B, I, J), got shape {c.shape}")
    return 1.0 - t_score(c)


def t_score_resolution(dtype, outputs: int) -> float:
    """The smallest T-score that couplings stored in ``dtype`` over ``outputs`` capsules can show
    beyond rounding: T of a row whose entries differ from 1/J by one relative rounding unit
    (eps^2 / (2 log J), about 3e-15 for float32 and J = 10). A measured |T| below it is float
    rounding of a uniform coupling, not a routing effect."""
    if outputs < 2:
        return 0.0
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return eps * eps / (2.0 * math.log(outputs))


def polarization(c) -> float:
    """Mean over (b, i) of max_j c[b, i, j] for couplings c (B, I, J)."""
    c = _native(c)
    with on_device_of(c):
        return float(c.max(axis=-1).mean(dtype=np.float64))


def d_score(v) -> float:
    """Max over j of the standard deviation over the batch of |v[b, j]|, for outputs v (B, J, D)."""
    v = _values(v)
    if v.ndim != 3:
        raise ValueError(f"d_score: expected v (B, J, D), got shape {v.shape}")
    return float(np.linalg.norm(v, axis=-1).std(axis=0).max())


def activation_d_score(a) -> float:
    """Max over j of the standard deviation over the batch of the activations a[b, j] (B, J): the
    D-score of a layer whose routing gives its output capsules activations (its class scores)."""
    a = _values(a)
    if a.ndim != 2:
        raise ValueError(f"activation_d_score: expected activations (B, J), got shape {a.shape}")
    return float(a.std(axis=0).max())


def d_score_source(trace) -> str:
    """What a trace's D-score is taken from: "activations" where its routing recorded output
    activations for every iteration (EM routing, self-routing), else "lengths" (of the outputs)."""
    activations = getattr(trace, "activations", None) or []
    return "activations" if activations and len(activations) == len(trace.outputs) else "lengths"


def agreement_cosine(u_hat, v, agreement=None, u_hat_lengths=None) -> float:
    """Mean over (b, i, j) of cos(u_hat[b, i, j], v[b, j]) for u_hat (B, I, J, D) and v (B, J, D).

    ``agreement`` (B, I, J), the dot products <u_hat, v> when already known (a trace's a_r), and
    ``u_hat_lengths`` (B, I, J) from ``prediction_lengths`` spare the passes over u_hat.
    """
    u, v = _native(u_hat), _native(v)
    if u.ndim != 4 or tuple(v.shape) != (u.shape[0],) + tuple(u.shape[2:]):
        raise ValueError(f"agreement_cosine: expected u_hat (B, I, J, D) and v (B, J, D), got {u.shape} and {v.shape}")
    xp = array_module(u)
    with on_device_of(u):
        if agreement is None:
            with tc.no_grad():
                agreement = F.routing_agreement(Tensor._wrap(u), Tensor._wrap(v.astype(u.dtype, copy=False)))
        dot = _native(agreement)
        lengths = prediction_lengths(u) if u_hat_lengths is None else _native(u_hat_lengths)
        norms = lengths * xp.sqrt((v * v).sum(axis=-1))[:, None, :]
        return float((dot / xp.maximum(norms, _EPS)).mean(dtype=np.float64))


def _grad_norm(t, tracked=None):
    """Frobenius norm of ``t.grad`` (or ``tracked``, the norm a trace recorded during the backward);
    0.0 when ``t`` is detached (no gradient can reach it); None when it could have one but none was kept."""
    if not getattr(t, "requires_grad", False):
        return 0.0
    if t.grad is None:
        return tracked
    g = t.grad.data
    with on_device_of(g):
        return float(array_module(g).linalg.norm(g.ravel()))  # one BLAS dot, in the gradient's own dtype


class IterationView:
    """Iteration r of one routing layer's trace, as the per-iteration figures read it
    (``figures.Figure.compute``); what several of them share is computed once: the T-score (the
    entropy is 1 - T) and |u_hat|, per distinct u_hat array, across the iterations whose views
    share ``lengths`` (every u_hat_sum[r] of a real trace views the same u_hat)."""

    def __init__(self, trace, r: int, lengths: dict | None = None, from_activations: bool | None = None):
        self.trace, self.r = trace, r
        self._lengths = {} if lengths is None else lengths
        self.from_activations = (d_score_source(trace) == "activations" if from_activations is None
                                 else from_activations)

    @property
    def coupling(self):
        """c_r (B, I, J)."""
        return self.trace.coupling[self.r]

    @property
    def outputs(self):
        """v_r (B, J, D)."""
        return self.trace.outputs[self.r]

    @functools.cached_property
    def t_score(self) -> float:
        """``t_score`` of c_r."""
        return t_score(self.coupling)

    @property
    def d_score(self) -> float:
        """The D-score of iteration r: of the output activations where the routing has them, else of
        the output lengths (``d_score_source``)."""
        if self.from_activations:
            return activation_d_score(self.trace.activations[self.r])
        return d_score(self.outputs)

    @property
    def has_u_hat(self) -> bool:
        """Whether the trace recorded u_hat's use in the weighted sum of iteration r."""
        return self.r < len(self.trace.u_hat_sum)

    @property
    def agreement_cosine(self):
        """``agreement_cosine`` of u_hat and v_r (the trace's a_r where it holds the dot products;
        |u_hat| shared); None where the trace recorded no u_hat for r."""
        if not self.has_u_hat:
            return None
        u = _native(self.trace.u_hat_sum[self.r])
        key = _array_key(u)
        if key not in self._lengths:
            self._lengths[key] = prediction_lengths(u)
        trace, r = self.trace, self.r
        known = trace.agreement[r] if r < len(trace.agreement) and getattr(trace, "dot_agreement", True) else None
        return agreement_cosine(u, self.outputs, known, self._lengths[key])

    def grad_norm(self, path: str):
        """The norm of the gradient reaching u_hat through ``path`` ("sum" or "agreement") at
        iteration r (``_grad_norm``); None where the trace has no such use of u_hat for r."""
        uses = self.trace.u_hat_sum if path == "sum" else self.trace.u_hat_agreement
        if self.r >= len(uses):
            return None
        tracked = getattr(self.trace, "grad_norms", {})
        return _grad_norm(uses[self.r], tracked.get((f"u_hat_{path}", self.r)))


def routing_statistics(trace) -> dict:
    """Statistics of every iteration of one routing layer.

    Args:
        trace: a RoutingTrace (its coupling and outputs at least; u_hat_sum for the cosine and the
            gradient norms, which need ``trace.retain_grad()`` before a backward).
    Returns:
        A dict with one list (one entry per iteration r = 0..R-1) per statistic:
        "coupling_entropy", "t_score", "polarization", "d_score" (from the output activations where
        the routing has them, else the output lengths: see ``d_score_source``), "agreement_cosine", and
        "grad_norm_sum" / "grad_norm_agreement", the Frobenius norms of ``u_hat_sum[r].grad`` /
        ``u_hat_agreement[r].grad`` (0.0 where that use of u_hat is detached; None where no gradient
        was retained or tracked (``trace.track_grad_norms()``), and where the trace has no agreement
        path for r: the last iteration of dynamic and EM routing); then every per-iteration figure
        registered with ``figures.register_figure`` (``STATISTICS`` names them all, in this order).
    """
    from .figures import iteration_figures  # (figures.py builds on this module's functions)

    iterations = len(trace.coupling)
    if len(trace.outputs) != iterations:
        raise ValueError(f"routing_statistics: the trace has {iterations} couplings but {len(trace.outputs)} outputs")
    figures = iteration_figures()
    stats = {figure.name: [] for figure in figures}
    lengths, from_activations = {}, d_score_source(trace) == "activations"
    for r in range(iterations):
        view = IterationView(trace, r, lengths, from_activations)
        for figure in figures:
            stats[figure.name].append(figure.compute(view))
    return stats


def per_iteration(stats: dict) -> list:
    """The dict of lists from ``routing_statistics`` as one dict per iteration: [{"iteration": 0, ...}, ...]."""
    count = len(stats["coupling_entropy"])
    return [dict({"iteration": r}, **{name: values[r] for name, values in stats.items()}) for r in range(count)]


def layer_statistics(trace, name: str | None = None) -> dict:
    """One routing layer's entry in the gradient-flow report and ``gradflow.jsonl``: {"name" (the
    trace's, else ``name``, else "digit"), "d_score_from" (``d_score_source``), "iterations"
    (``per_iteration(routing_statistics(trace))``)}."""
    return {"name": trace.name or name or "digit", "d_score_from": d_score_source(trace),
            "iterations": per_iteration(routing_statistics(trace))}


def _sources(layers: list):
    """The D sources of ``layers`` ("activations", "lengths", both joined by " and ", or None where
    no layer says: a log written before layers said it)."""
    found = sorted({layer["d_score_from"] for layer in layers if layer.get("d_score_from")})
    return " and ".join(found) or None


def network_scores(layers: list) -> dict:
    """The network's T and D as Peer et al. report them, from per-layer statistics in the layout of
    ``gradient_flow_report`` and ``gradflow.jsonl`` (``[{"name", "iterations": [{"t_score",
    "d_score", ...}, ...]}, ...]``, bottom to top, DigitCaps last), each layer's last iteration:

    {"t_score": mean of the routing layers' T, "d_score": mean of the hidden layers' D (None without
    a hidden layer), "digit_d_score": DigitCaps' D (forced by the loss: not Peer et al.'s D-score),
    "d_score_from" / "digit_d_score_from": what those D were taken from ("activations" or "lengths",
    None where the layers do not say), "layers": {name: {"t_score", "d_score"} (and "d_score_from"
    where the layer says)}}.
    """
    if not layers:
        raise ValueError("network_scores: no routing layer")
    last = {layer["name"]: layer["iterations"][-1] for layer in layers}
    hidden = [row["d_score"] for name, row in last.items() if name != layers[-1]["name"]]
    source = {layer["name"]: layer.get("d_score_from") for layer in layers}
    return {"t_score": float(np.mean([row["t_score"] for row in last.values()])),
            "d_score": float(np.mean(hidden)) if hidden else None,
            "digit_d_score": last[layers[-1]["name"]]["d_score"],
            "d_score_from": _sources(layers[:-1]) if hidden else None,
            "digit_d_score_from": source[layers[-1]["name"]],
            "layers": {name: dict({"t_score": row["t_score"], "d_score": row["d_score"]},
                                  **({"d_score_from": source[name]} if source[name] else {}))
                       for name, row in last.items()}}


def path_norms(rows: list) -> list | None:
    """Per iteration, the gradient norm reaching the votes through both paths (an absent path, as the
    last iteration's agreement, counts 0); None where a line kept no gradient for a path that exists."""
    norms = []
    for row in rows:
        if row["grad_norm_sum"] is None:
            return None
        norms.append(row["grad_norm_sum"] + (row["grad_norm_agreement"] or 0.0))
    return norms


def inner_share(iterations: list):
    """The share of the inner iterations (r < R - 1) in the gradient norms reaching u_hat through
    every path of every iteration (``iterations``: a trace's or a gradflow line's per-iteration
    rows); None at one iteration or where a row kept no gradient for a path that exists."""
    norms = path_norms(iterations)
    if norms is None or len(norms) < 2:
        return None
    total = sum(norms)
    return sum(norms[:-1]) / total if total else 0.0


def path_shares(iterations: list) -> list:
    """(share of the sum path, share of the agreement path) per iteration: each path's gradient norm
    over the sum of the norms of all paths (0.0 where no gradient reaches u_hat; None for the
    agreement of the last iteration, which has none)."""
    norms = [(row["grad_norm_sum"] or 0.0, row["grad_norm_agreement"]) for row in iterations]
    total = sum(a + (b or 0.0) for a, b in norms)
    return [(a / total if total else 0.0, None if b is None else (b / total if total else 0.0)) for a, b in norms]
