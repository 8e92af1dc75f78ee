"""EM routing, self-attention routing and self-routing in plain NumPy loops, float64, written from
the formulas of the issue that specifies them and independently of the engine (no engine import,
no shared helper): the oracles of ``em_routing``, ``self_attention_routing`` and ``self_routing``.
Their gradients are central differences of these forwards (``reference_routing.central_differences``).
"""
import math

import numpy as np


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def softmax(values):
    shifted = np.asarray(values, dtype=np.float64) - np.max(values)
    e = np.exp(shifted)
    return e / e.sum()


def em_route(u_hat, activations, beta_u, beta_a, iterations, lambdas, frozen=None, eps=1e-8, cost_factor=1.0,
             first_r=None):
    """Procedure 1 of Hinton, Sabour & Frosst (2018) with vector poses.

    ``frozen``: None, or (u_hat, activations, beta_u, beta_a) from which every iteration before the
    last computes the R that the last M-step receives (the "detach" mode: those inputs held fixed).
    ``cost_factor``: a factor on the cost (IBM's layer_norm_factor); ``first_r``: the first R's value
    (None: 1 / J, as Procedure 1; SR-CapsNet's code starts at 1).
    Returns (poses (B, J, D), activations (B, J), [R of every iteration] (B, I, J)).
    """
    u_hat = np.asarray(u_hat, dtype=np.float64)
    batch, inputs, outputs, dim = u_hat.shape
    if np.isscalar(lambdas):
        lambdas = [lambdas] * iterations
    early = (u_hat, activations, beta_u, beta_a) if frozen is None else frozen
    R = np.full((batch, inputs, outputs), 1.0 / outputs if first_r is None else first_r)
    couplings = []
    for t in range(iterations):
        last = t == iterations - 1
        votes, a_in, b_u, b_a = (u_hat, activations, beta_u, beta_a) if last else early
        votes = np.asarray(votes, dtype=np.float64)
        couplings.append(R.copy())
        mu = np.zeros((batch, outputs, dim))
        var = np.zeros((batch, outputs, dim))
        a_out = np.zeros((batch, outputs))
        for b in range(batch):
            for j in range(outputs):
                m = 0.0
                for i in range(inputs):
                    m += R[b, i, j] * a_in[b, i]
                for i in range(inputs):
                    mu[b, j] += R[b, i, j] * a_in[b, i] * votes[b, i, j] / (m + eps)
                for i in range(inputs):
                    var[b, j] += R[b, i, j] * a_in[b, i] * (votes[b, i, j] - mu[b, j]) ** 2 / (m + eps)
                var[b, j] += eps
                cost = (b_u[j] * dim + 0.5 * sum(math.log(x) for x in var[b, j])) * m * cost_factor
                a_out[b, j] = sigmoid(lambdas[t] * (b_a[j] - cost))
        if not last:
            R = np.zeros((batch, inputs, outputs))
            for b in range(batch):
                for i in range(inputs):
                    scores = []
                    for j in range(outputs):
                        log_p = 0.0
                        for d in range(dim):
                            log_p -= (votes[b, i, j, d] - mu[b, j, d]) ** 2 / (2 * var[b, j, d])
                            log_p -= 0.5 * math.log(2 * math.pi * var[b, j, d])
                        scores.append(math.log(a_out[b, j]) + log_p)
                    R[b, i] = softmax(scores)
    return mu, a_out, couplings


def efficient_squash(s, eps=1e-20):
    """Mazzia et al.'s squash of one vector: (1 - 1 / (exp(|s|) + eps)) * s / (|s| + eps)."""
    norm = math.sqrt(float((s * s).sum()))
    return (1 - 1 / (math.exp(norm) + eps)) * s / (norm + eps)


def sabour_squash(s, eps=1e-8):
    """Sabour et al.'s squash of one vector: |s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps)."""
    n2 = float((s * s).sum())
    return n2 / (1 + n2) * s / math.sqrt(n2 + eps)


def self_attention_route(u_hat, bias, squash=efficient_squash):
    """Mazzia et al. (2021), FCCaps: returns (v (B, J, D), c (B, I, J))."""
    u_hat = np.asarray(u_hat, dtype=np.float64)
    batch, inputs, outputs, dim = u_hat.shape
    c = np.zeros((batch, inputs, outputs))
    v = np.zeros((batch, outputs, dim))
    for b in range(batch):
        for i in range(inputs):
            scores = []
            for j in range(outputs):
                total = np.zeros(dim)
                for k in range(inputs):
                    total += u_hat[b, k, j]
                scores.append(float(u_hat[b, i, j] @ total) / math.sqrt(dim))
            c[b, i] = softmax(scores)
        for j in range(outputs):
            s = np.zeros(dim)
            for i in range(inputs):
                s += (c[b, i, j] + bias[i, j]) * u_hat[b, i, j]
            v[b, j] = squash(s)
    return v, c


def self_route(u_hat, u, activations, route_weight, route_bias, eps=1e-8):
    """Hahn, Pyeon & Kim (2019): returns (v (B, J, D), a (B, J), c (B, I, J))."""
    u_hat = np.asarray(u_hat, dtype=np.float64)
    batch, inputs, outputs, dim = u_hat.shape
    c = np.zeros((batch, inputs, outputs))
    v = np.zeros((batch, outputs, dim))
    a_out = np.zeros((batch, outputs))
    for b in range(batch):
        for i in range(inputs):
            logits = [float(route_weight[i, j] @ u[b, i]) + route_bias[i, j] for j in range(outputs)]
            c[b, i] = softmax(logits)
        total_a = sum(activations[b, i] for i in range(inputs))
        for j in range(outputs):
            mass = sum(c[b, i, j] * activations[b, i] for i in range(inputs))
            a_out[b, j] = mass / (total_a + eps)
            for i in range(inputs):
                v[b, j] += c[b, i, j] * activations[b, i] * u_hat[b, i, j]
            v[b, j] /= mass + eps
    return v, a_out, c
