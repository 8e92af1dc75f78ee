"""CapsNet written directly in PyTorch: the oracle of the CapsNet tests and of fixtures.npz beside it.

Procedure 1 of Sabour et al. with the paper's margin and reconstruction losses (default weights),
PrimaryCaps laid out as (types, positions) with the permute, and optional hidden capsule layers
(``hidden.k.weight``/``hidden.k.bias``) and capsule biases (``digit.bias``) as in Peer et al.
Nothing here imports tinygrad_caps.
"""


def squash(torch, t):
    """|t|^2 / (1 + |t|^2) * t / sqrt(|t|^2 + 1e-8) along the last axis."""
    sq = (t * t).sum(-1, keepdim=True)
    return sq / (1 + sq) * t / torch.sqrt(sq + 1e-8)


def route(torch, u, weight, iterations, gradient, bias=None):
    """Dynamic routing of u (B, I, K) through weight (I, J, D, K); the bias (J, D) joins s before the squash."""
    u_hat = torch.einsum("ijdk,bik->bijd", weight, u)
    frozen = u_hat.detach() if gradient == "detach" else u_hat
    logits = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype)
    for r in range(iterations):
        predictions = u_hat if r == iterations - 1 else frozen
        c = torch.softmax(logits, dim=2)
        s = torch.einsum("bij,bijd->bjd", c, predictions)
        v = squash(torch, s if bias is None else s + bias)
        if r < iterations - 1:
            logits = logits + torch.einsum("bijd,bjd->bij", predictions, v)
    return v


def torch_capsnet(torch, p, x, y, iterations, gradient, types, dim, hidden_layers=0):
    """The CapsNet with parameters ``p`` (name -> torch tensor) on images x, labels y.

    Returns (v, lengths, reconstruction, loss).
    """
    f = torch.nn.functional
    h = f.relu(f.conv2d(x, p["conv1.weight"], p["conv1.bias"]))
    s = f.conv2d(h, p["primary.weight"], p["primary.bias"], stride=2)
    b, _, hh, ww = s.shape
    u = squash(torch, s.view(b, types, dim, hh, ww).permute(0, 1, 3, 4, 2).reshape(b, types * hh * ww, dim))
    for k in range(hidden_layers):
        u = route(torch, u, p[f"hidden.{k}.weight"], iterations, gradient, p.get(f"hidden.{k}.bias"))
    v = route(torch, u, p["digit.weight"], iterations, gradient, p.get("digit.bias"))
    lengths = torch.sqrt((v * v).sum(-1) + 1e-8)
    mask = f.one_hot(y, v.shape[1]).to(v.dtype)
    d = (v * mask[..., None]).reshape(b, -1)
    d = f.relu(f.linear(d, p["decoder.fc1.weight"], p["decoder.fc1.bias"]))
    d = f.relu(f.linear(d, p["decoder.fc2.weight"], p["decoder.fc2.bias"]))
    recon = torch.sigmoid(f.linear(d, p["decoder.fc3.weight"], p["decoder.fc3.bias"]))
    margin = (mask * f.relu(0.9 - lengths) ** 2 + 0.5 * (1 - mask) * f.relu(lengths - 0.1) ** 2).sum(1)
    loss = (margin + 0.0005 * ((recon - x.reshape(b, -1)) ** 2).sum(1)).mean()
    return v, lengths, recon, loss
