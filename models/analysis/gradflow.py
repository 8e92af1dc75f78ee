"""gradient_flow_report: one batch, the same weights, each routing-gradient mode in turn; what
reaches u_hat through each iteration and path, the routing statistics of every routing layer, the
gradient of every parameter, and optionally the top Hessian eigenvalue of the loss in digit.weight.
"""
from __future__ import annotations

import contextlib

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.backend import to_numpy

from ..capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT
from ..capsnet.routing import check_gradient_mode, other_mode_refusal
from ..capsnet.routing import supported_modes as modes_of_layers
from .routing_statistics import layer_statistics, network_scores

HESSIAN_PARAMETER = "digit.weight"


def routing_layers(model) -> list:
    """(name, layer) of every routing layer of ``model``, bottom to top."""
    if hasattr(model, "routing_layers"):
        return list(model.routing_layers())
    return [("digit", model.digit)]


@contextlib.contextmanager
def _temporarily(objects, attribute: str, value):
    """Set ``attribute`` to ``value`` on every one of ``objects`` for the block; the old values come back after."""
    objects = list(objects)
    previous = [getattr(o, attribute) for o in objects]
    try:
        for o in objects:
            setattr(o, attribute, value)
        yield
    finally:
        for o, before in zip(objects, previous):
            setattr(o, attribute, before)


def supported_modes(model) -> tuple:
    """The routing-gradient modes that every routing layer of ``model`` takes ("full" alone where a
    routing is not iterative; ``capsnet.routing.supported_modes``)."""
    return modes_of_layers(layer for _, layer in routing_layers(model))


def check_mode(model, mode: str, who: str = "gradient_flow_report") -> None:
    """ValueError in one line unless every routing layer of ``model`` takes gradient mode ``mode``
    (``capsnet.routing.check_gradient_mode``)."""
    check_gradient_mode((layer for _, layer in routing_layers(model)), mode, who)


def routing_gradient(model, mode: str):
    """Run every routing layer of ``model`` in gradient mode ``mode``; the previous modes come back after."""
    check_mode(model, mode)
    return _temporarily((layer for _, layer in routing_layers(model)), "gradient", mode)


def _kept_parameter_grads(model):
    """Leave every parameter's ``.grad`` as it was before the block (the report's backwards use their own)."""
    return _temporarily(model.parameters(), "grad", None)


@contextlib.contextmanager
def _substituted_parameter(model, dotted_name: str, tensor):
    """Let ``model``'s forward read ``tensor`` in place of parameter ``dotted_name`` (same registry slot)."""
    module_name, _, attribute = dotted_name.rpartition(".")
    module = model
    for part in module_name.split(".") if module_name else ():
        module = getattr(module, part)
    registry = module._registries()[0]
    if attribute not in registry:
        raise ValueError(f"gradient_flow_report: the model has no parameter {dotted_name}")
    original = registry[attribute]
    registry[attribute] = tensor
    try:
        yield original
    finally:
        registry[attribute] = original


def batch_loss(model, x, labels, reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT, return_trace=False):
    """The training loss of one batch (``model.loss``: the class loss of the model's recipe, the margin
    loss in its convention under the common one, + weighted reconstruction, decoder masked by the
    labels); with ``return_trace`` also the model's routing traces."""
    outputs = model(x, labels, return_trace=return_trace)
    loss = model.loss(outputs, x, labels, reconstruction_weight)
    return (loss, outputs.traces) if return_trace else loss


def _norm(array) -> float:
    return float(np.linalg.norm(np.asarray(array, dtype=np.float64)))


def _cosine(a, b):
    denominator = _norm(a) * _norm(b)
    if denominator == 0.0:
        return None
    return float(np.dot(a.ravel().astype(np.float64), b.ravel().astype(np.float64)) / denominator)


def hessian_top_eigenvalue(model, x, labels, iterations: int, reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT,
                           seed=0, parameter=HESSIAN_PARAMETER) -> float:
    """The largest-magnitude eigenvalue of the Hessian of the batch loss in ``parameter``, by
    ``iterations`` steps of power iteration with ``tc.hvp`` (the Rayleigh quotient of the last vector)."""
    weights = dict(model.named_parameters())
    if parameter not in weights:
        raise ValueError(f"gradient_flow_report: the model has no parameter {parameter}")
    weight = weights[parameter]

    def loss_in(w):
        with _substituted_parameter(model, parameter, w):
            return batch_loss(model, x, labels, reconstruction_weight)

    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(weight.shape)
    direction /= np.linalg.norm(direction)
    eigenvalue = 0.0
    for _ in range(iterations):
        v = tc.Tensor(direction, dtype=weight.dtype, device=weight.device)
        _, product = tc.hvp(loss_in, tc.Tensor._wrap(weight.data), v)
        product = to_numpy(product.data).astype(np.float64)
        eigenvalue = float((direction * product).sum())
        length = np.linalg.norm(product)
        if length == 0.0:
            break
        direction = product / length
    return eigenvalue


def gradient_flow_report(model, images, labels, modes=None, hessian_iterations=0,
                         reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT) -> dict:
    """Measure the gradient flow of one batch in each routing-gradient mode, on the same weights.

    Args:
        model: a CapsNet (its routing layers' gradient modes are switched and restored; its
            parameters' ``.grad`` are left as they were).
        images: (B, C, H, W) model inputs (floats, already preprocessed). labels: (B,) integers.
        modes: gradient modes to measure, e.g. ("full", "detach"); None: every mode the model's
            routing layers take (``supported_modes``: "full" alone where a routing is not iterative).
        hessian_iterations: > 0 adds the top Hessian eigenvalue in digit.weight per mode.
        reconstruction_weight: the reconstruction term's weight in the loss.
    Returns:
        {"config": {...}, "modes": {mode: {"loss", "layers": [{"name", "d_score_from" ("activations"
        where the routing has output activations, else "lengths"), "iterations": [{"iteration",
        "coupling_entropy", "t_score", "polarization", "d_score", "agreement_cosine",
        "grad_norm_sum", "grad_norm_agreement"}, ...]}, ...], "network": the network's T and D as
        Peer et al. report them (``routing_statistics.network_scores``), "parameter_grad_norms":
        {name: norm}, "hessian_top_eigenvalue": float or None}}, "mode_cosine": {name: cosine of the
        gradients in the first two modes (None where one is zero)}}.
    """
    modes = supported_modes(model) if modes is None else tuple(modes)
    if not modes:
        raise ValueError("gradient_flow_report: give at least one mode")
    for mode in modes:
        check_mode(model, mode)
    if hessian_iterations < 0:
        raise ValueError(f"gradient_flow_report: hessian_iterations must be >= 0, got {hessian_iterations}")
    x = images if isinstance(images, tc.Tensor) else tc.tensor(np.asarray(images), device=model.device)
    labels = np.asarray(to_numpy(labels.data) if isinstance(labels, tc.Tensor) else labels)
    if x.ndim != 4 or labels.shape != (x.shape[0],):
        raise ValueError(f"gradient_flow_report: expected images (B, C, H, W) and labels (B,), got {x.shape} "
                         f"and {labels.shape}")
    report = {"config": {"modes": list(modes), "batch_size": int(x.shape[0]), "hessian_iterations": int(hessian_iterations),
                         "hessian_parameter": HESSIAN_PARAMETER if hessian_iterations else None,
                         "reconstruction_weight": reconstruction_weight, "model": dict(getattr(model, "config", {}))},
              "modes": {}, "mode_cosine": {}}
    gradients = {}
    with _kept_parameter_grads(model):
        for mode in modes:
            with routing_gradient(model, mode):
                report["modes"][mode], grads = _measure(model, x, labels, reconstruction_weight, hessian_iterations)
            if len(gradients) < 2:
                gradients[mode] = grads
    if len(gradients) == 2:
        first, second = (gradients[m] for m in modes[:2])
        report["mode_cosine"] = {name: _cosine(first[name], second[name]) for name in first}
    return report


def _measure(model, x, labels, reconstruction_weight, hessian_iterations):
    """(the report of one mode, {parameter name: gradient as float64 NumPy})."""
    model.zero_grad()
    loss, traces = batch_loss(model, x, labels, reconstruction_weight, return_trace=True)
    for trace in traces:
        trace.retain_grad()
    loss.backward()
    names = [name for name, _ in routing_layers(model)]
    layers = [layer_statistics(trace, name) for name, trace in zip(names, traces)]
    grads = {}
    for name, p in model.named_parameters():
        grads[name] = np.zeros(p.shape) if p.grad is None else to_numpy(p.grad.data).astype(np.float64)
    result = {"loss": float(loss.item()), "layers": layers, "network": network_scores(layers),
              "parameter_grad_norms": {name: _norm(g) for name, g in grads.items()},
              "hessian_top_eigenvalue": None}
    del traces, loss
    model.zero_grad()
    if hessian_iterations:
        result["hessian_top_eigenvalue"] = hessian_top_eigenvalue(model, x, labels, hessian_iterations,
                                                                  reconstruction_weight)
    return result, grads


def mode_gradient_cosines(model, x, labels, reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT) -> dict:
    """Right after a training step's backward (its gradients in the parameters' ``.grad``, in the
    model's own routing-gradient mode): the cosine between those gradients and the ones the other
    mode gives on the same batch and weights, per parameter and over all parameters together ("all").

    One more forward and backward, in the other mode; the parameters' ``.grad`` are left as they
    were. None where either gradient is zero.
    """
    own_mode = routing_layers(model)[-1][1].gradient
    modes = supported_modes(model)
    refusal = other_mode_refusal(model.config.routing, modes, "mode_gradient_cosines")
    if refusal:
        raise ValueError(refusal)
    other = next(mode for mode in modes if mode != own_mode)
    own = {name: np.zeros(p.shape) if p.grad is None else to_numpy(p.grad.data).astype(np.float64)
           for name, p in model.named_parameters()}
    with _kept_parameter_grads(model), routing_gradient(model, other):
        model.zero_grad()
        batch_loss(model, x, labels, reconstruction_weight).backward()
        theirs = {name: np.zeros(p.shape) if p.grad is None else to_numpy(p.grad.data).astype(np.float64)
                  for name, p in model.named_parameters()}
    cosines = {name: _cosine(own[name], theirs[name]) for name in own}
    cosines["all"] = _cosine(np.concatenate([g.ravel() for g in own.values()]),
                             np.concatenate([g.ravel() for g in theirs.values()]))
    return cosines


def mean_of_reports(reports: list) -> dict:
    """The element-wise mean of reports with the same layout (numbers averaged; entries that are equal
    in every report, such as names and the config, kept; None where any report has None)."""
    if not reports:
        raise ValueError("mean_of_reports: no reports")
    return _mean(reports)


def _mean(values):
    first = values[0]
    if isinstance(first, dict):
        return {key: _mean([v[key] for v in values]) for key in first}
    if isinstance(first, list) and all(isinstance(v, list) and len(v) == len(first) for v in values) and \
            any(isinstance(item, (dict, list, float)) for item in first):
        return [_mean([v[k] for v in values]) for k in range(len(first))]
    if all(v == first for v in values):
        return first
    if any(v is None for v in values):
        return None
    return float(np.mean([float(v) for v in values]))
