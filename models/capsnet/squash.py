"""The capsule nonlinearities a CapsNet can use (``CapsNet(squash=NAME, squash_eps=EPS)``), by name.

``SQUASHES`` maps each name to a function ``(s, eps) -> v`` over the last axis of ``s``; the
config's ``squash`` option, its CLI choices and its README row are derived from this table, so a
new nonlinearity is one function and one entry here.

    "sabour"  Sabour et al. (2017), eq. 1, with eps under the root where the norm divides:
              v = |s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps). Cubic near s = 0 (|v| ~ |s|^3 /
              sqrt(eps)), so its derivative there is 0: a capsule whose input is (nearly) zero
              passes (almost) no gradient back.
    "peer"    Peer et al.'s code (peerdavid/capsnet-limitations and gamma-capsule-network,
              ``capsule/utils.py`` ``squash``): n = |s|^2 + eps; v = n / (1 + n) * s / sqrt(n) + eps.
              Linear near s = 0 (v ~ sqrt(eps) s + eps), so the gradient does not vanish there.
              capsnet-limitations uses eps = 1e-8, gamma-capsule-network 1e-12.
    "efficient" Mazzia et al. (2021), Efficient-CapsNet (their ``Squash`` layer):
              v = (1 - 1 / (exp(|s|) + eps)) * s / (|s| + eps), eps 1e-20 in their code (the model
              takes ``squash_eps``; ``squash_function("efficient")`` alone uses their 1e-20). Linear
              near s = 0 (v ~ s), saturating at |v| -> 1 faster than Sabour et al.'s.
"""
from __future__ import annotations

from tinygrad_caps import functional as F

DEFAULT_SQUASH_EPS = 1e-8


def sabour_squash(s, eps: float = DEFAULT_SQUASH_EPS):
    """|s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps) over the last axis (one engine op, ``F.squash``)."""
    return F.squash(s, axis=-1, eps=eps)


def peer_squash(s, eps: float = DEFAULT_SQUASH_EPS):
    """n / (1 + n) * s / sqrt(n) + eps with n = |s|^2 + eps, over the last axis, from engine ops."""
    n = F.sum(s * s, axis=-1, keepdims=True) + eps
    return n / (1 + n) * s / F.sqrt(n) + eps


NORM_FLOOR = 1e-30  # added under efficient_squash's square root (a normal float32 number)


def efficient_squash(s, eps: float = 1e-20):
    """(1 - 1 / (exp(|s|) + eps)) * s / (|s| + eps) over the last axis, from engine ops.

    |s| is taken as sqrt(|s|^2 + 1e-30): the same value to the last bit wherever |s| is above about
    1e-11 (float32) or 1e-7 (float64), a relative change below 1e-16 above 1e-7, and a finite
    gradient (0) at s = 0, where the plain square root's derivative is infinite."""
    norm = F.sqrt(F.sum(s * s, axis=-1, keepdims=True) + NORM_FLOOR)
    return (1 - 1 / (F.exp(norm) + eps)) * s / (norm + eps)


SQUASHES = {"sabour": sabour_squash, "peer": peer_squash, "efficient": efficient_squash}
# The eps a squash takes when none is given (the model always gives its ``squash_eps``).
OWN_EPS = {"efficient": 1e-20}


class Nonlinearity:
    """The nonlinearity ``name`` of ``SQUASHES`` with its ``eps`` bound: called on s, returns v (last
    axis); a plain object, so a model that holds one still pickles and copies."""

    def __init__(self, name: str = "sabour", eps: float | None = None):
        if name not in SQUASHES:
            raise ValueError(f"squash must be one of {', '.join(SQUASHES)}, got {name!r}")
        self.name, self.eps = name, float(OWN_EPS.get(name, DEFAULT_SQUASH_EPS) if eps is None else eps)

    def __call__(self, s):
        return SQUASHES[self.name](s, self.eps)

    def __repr__(self) -> str:
        return f"Nonlinearity({self.name!r}, eps={self.eps:g})"


def squash_function(name: str = "sabour", eps: float | None = None) -> Nonlinearity:
    """The nonlinearity ``name`` with ``eps`` (None: 1e-8, or the squash's own in ``OWN_EPS``): a
    callable ``s -> v`` over the last axis."""
    return Nonlinearity(name, eps)


def as_nonlinearity(squash):
    """``squash`` as a callable over the last axis: a name of ``SQUASHES`` (with its own eps), a
    callable as it is, or None for Sabour et al.'s."""
    if squash is None:
        return sabour_squash
    return squash_function(squash) if isinstance(squash, str) else squash
