"""RoutingTrace: every intermediate of one routing layer's iterations, as Tensors of the graph.

The two uses of u_hat in an iteration (the weighted sum, and the agreement that updates the
logits) enter through identity nodes of their own, so ``trace.retain_grad()`` and one backward
measure the gradient that reaches u_hat through each iteration and each path separately; in the
"full" gradient mode they sum to the gradient of u_hat itself.

Every routing algorithm fills the same fields (the docstring of its module in ``routing/`` says
how): an iteration's coupling, its outputs, and the uses of u_hat through identity nodes, the use
that makes the outputs in ``u_hat_sum`` and the use that makes the next coupling in
``u_hat_agreement``. Algorithms with output activations (EM routing, self-routing) also record
them in ``activations``; an ``agreement`` that is not the dot product <u_hat, v> (EM's log
likelihood, self-attention's scores) is marked by ``dot_agreement=False``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from tinygrad_caps.backend import array_module

_FIELDS = ("logits", "coupling", "weighted", "outputs", "agreement", "u_hat_sum", "u_hat_agreement", "activations")


@dataclass
class RoutingTrace:
    """The routing of one layer, for iterations r = 0..R-1 (lists of Tensors).

    Attributes:
        logits: b_r (B, I, J), b_0 = 0.
        coupling: c_r = softmax of b_r over J (B, I, J).
        weighted: s_r = sum_i c_r u_hat (+ bias) (B, J, D).
        outputs: v_r = squash(s_r) (B, J, D).
        agreement: a_r = <u_hat, v_r> (B, I, J), for r < R-1 (R-1 entries).
        u_hat_sum: u_hat as used by iteration r's weighted sum (B, I, J, D).
        u_hat_agreement: u_hat as used by iteration r's agreement (B, I, J, D), for r < R-1 in
            dynamic routing; an algorithm whose single step's coupling depends on its inputs has one
            entry for r = 0 (what it holds is the algorithm's: see its module in ``routing/``).
        activations: the output capsules' activations a_r (B, J) where the algorithm has them.
        gradient: the gradient mode the layer ran in ("full" or "detach").
        dot_agreement: whether ``agreement`` holds the dot products <u_hat, v_r> (statistics reuse
            them for the cosine); False where it holds another score.
        routing: the routing algorithm's name ("dynamic", "em", ...), or None.
        name: the layer's name in its model ("hidden.0", ..., "digit"), or None.
        grad_norms: {(attribute, r): Frobenius norm of the gradient} filled during a backward after
            ``track_grad_norms()`` (for "u_hat_sum" and "u_hat_agreement").
    """

    logits: list = field(default_factory=list)
    coupling: list = field(default_factory=list)
    weighted: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    agreement: list = field(default_factory=list)
    u_hat_sum: list = field(default_factory=list)
    u_hat_agreement: list = field(default_factory=list)
    activations: list = field(default_factory=list)
    gradient: str = "full"
    dot_agreement: bool = True
    routing: str | None = None
    name: str | None = None
    grad_norms: dict = field(default_factory=dict, repr=False)

    @property
    def iterations(self) -> int:
        """R, the number of iterations recorded."""
        return len(self.coupling)

    def record(self, **tensors) -> None:
        """Append each Tensor to the field it is named for (``trace.record(coupling=c, outputs=v)``)."""
        for attribute, tensor in tensors.items():
            if attribute not in _FIELDS:
                raise ValueError(f"RoutingTrace.record: no field {attribute!r}; the fields are {', '.join(_FIELDS)}")
            getattr(self, attribute).append(tensor)

    def tensors(self):
        """(attribute, r, Tensor) for every recorded tensor."""
        for attribute in _FIELDS:
            for r, t in enumerate(getattr(self, attribute)):
                yield attribute, r, t

    def track_grad_norms(self) -> "RoutingTrace":
        """Record, during the next backward, the Frobenius norm of the gradient reaching each use of
        u_hat (``u_hat_sum`` and ``u_hat_agreement``) in ``grad_norms``, without keeping the
        gradients themselves (what ``train --log-gradflow`` needs, at no memory cost); returns self."""
        for attribute in ("u_hat_sum", "u_hat_agreement"):
            for r, t in enumerate(getattr(self, attribute)):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._record_norm, (attribute, r)))
        return self

    def _record_norm(self, key, grad):
        g = grad.data
        self.grad_norms[key] = float(array_module(g).linalg.norm(g.ravel()))  # one BLAS dot, no copy

    def retain_grad(self) -> "RoutingTrace":
        """Keep ``.grad`` on every recorded tensor that requires grad (after the next backward); returns self."""
        for _, _, t in self.tensors():
            if getattr(t, "requires_grad", False):
                t.retain_grad()
        return self
