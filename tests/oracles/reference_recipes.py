"""The parts of the authors' recipes in plain NumPy (float64), written from their papers and code and
independently of the engine (no engine import): the oracles of ``capsnet/recipes.py``, the new
losses and initializations, and the learned input activations.

    spread loss         Hinton et al. (2018) eq. 3; IBM/matrix-capsules-with-em-routing models.py spread_loss
    margin schedule     Hinton et al. (2018) section 3.1: from 0.2, linearly, to 0.9; the authors'
                        OpenReview formula as IBM models.py spread_loss runs it; SR-CapsNet loss.py EmRoutingLoss
    EM cost scale       IBM em_routing.py m_step: layer_norm_factor = 100 / (child_caps / parent_caps)
    NLL of log a        coder3000/SR-CapsNet models/smallnet.py (out.log()) and trainer.py (nn.NLLLoss)
    lambda schedule     IBM em_routing.py and SR-CapsNet modules.py: final_lambda (1 - 0.95^(i+1)), final 0.01
    learned activations SR-CapsNet models/smallnet.py: sigmoid(BatchNorm2d(Conv2d(x, bias=False))), batch statistics
    he_normal           EscVM/Efficient-CapsNet utils/layers.py FCCaps (Keras he_normal, truncated normal)
    kaiming_uniform_    SR-CapsNet modules.py (PyTorch's kaiming_uniform_ of W1 (kkA, B*D, C) and of
                        EmRouting2d's W (kkA, B, 4, 4))
"""
import math

import numpy as np


def spread_loss(scores, labels, margin):
    """Per-example sum over the wrong classes i of max(0, m - (a_t - a_i))^2, by loops."""
    scores = np.asarray(scores, dtype=np.float64)
    out = np.zeros(scores.shape[0])
    for b, t in enumerate(labels):
        for i in range(scores.shape[1]):
            if i != t:
                out[b] += max(0.0, margin - (scores[b, t] - scores[b, i])) ** 2
    return out


def spread_margin(progress):
    """0.2 at the start of training, 0.9 at its end, linear in the share of steps done (clipped)."""
    progress = min(1.0, max(0.0, progress))
    return 0.2 + (0.9 - 0.2) * progress


def ibm_margin(global_step):
    """m = 0.2 + 0.79 * sigmoid(minimum(10, step / 50000 - 4)), in float64."""
    z = min(10.0, global_step / 50000.0 - 4)
    return 0.2 + 0.79 * (1.0 / (1.0 + math.exp(-z)))


def sr_capsnet_margin(epoch, max_epoch):
    """EmRoutingLoss(max_epoch)(..., epoch): margin_init 0.2, margin_step 0.2 / max_epoch, times
    min(epoch, max_epoch); 0.9 without an epoch."""
    if epoch is None:
        return 0.9
    return 0.2 + 0.2 / max_epoch * min(epoch, max_epoch)


def ibm_layer_norm_factor(child_caps, parent_caps):
    """IBM's m_step: 100 / (child_caps / parent_caps), the factor on the cost."""
    return 100 / (float(child_caps) / float(parent_caps))


def nll_of_log(scores, labels, eps=1e-12):
    """PyTorch's NLLLoss of log(scores) per example: -log(a_t) (eps as the engine's floor)."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.array([-math.log(scores[b, t] + eps) for b, t in enumerate(labels)])


def inverse_temperatures(iterations, final_lambda=0.01):
    """The lambda of each EM iteration i = 0 .. iterations - 1."""
    return [final_lambda * (1 - 0.95 ** (i + 1)) for i in range(iterations)]


def learned_activations(x, weight, stride, gamma=None, beta=None, eps=1e-5):
    """sigmoid(BN(conv(x))) in training mode (biased batch variance over N, H, W), flattened as
    (B, channel, row, column): x (B, C, H, W), weight (types, C, k, k)."""
    x = np.asarray(x, dtype=np.float64)
    n, _, h, w = x.shape
    types, _, k, _ = weight.shape
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    y = np.zeros((n, types, oh, ow))
    for b in range(n):
        for c in range(types):
            for r in range(oh):
                for s in range(ow):
                    y[b, c, r, s] = (x[b, :, r * stride:r * stride + k, s * stride:s * stride + k] * weight[c]).sum()
    mean = y.mean(axis=(0, 2, 3), keepdims=True)
    var = y.var(axis=(0, 2, 3), keepdims=True)
    gamma = np.ones(types) if gamma is None else gamma
    beta = np.zeros(types) if beta is None else beta
    normed = (y - mean) / np.sqrt(var + eps) * gamma[None, :, None, None] + beta[None, :, None, None]
    return (1.0 / (1.0 + np.exp(-normed))).reshape(n, -1)


def keras_he_normal_std(their_shape):
    """Keras' he_normal for a kernel of shape ``their_shape`` (fan_in = shape[-2] * prod(shape[:-2])):
    sqrt(2 / fan_in) / 0.87962566103423978, the normal then cut at two of these standard deviations."""
    fan_in = their_shape[-2] * math.prod(their_shape[:-2])
    return math.sqrt(2.0 / fan_in) / 0.87962566103423978


def torch_kaiming_uniform_bound(their_shape):
    """PyTorch's kaiming_uniform_ (a = 0, fan_in, leaky_relu) of a weight ``their_shape``: fan_in =
    size(1) * prod(size[2:]), bound sqrt(2) * sqrt(3 / fan_in)."""
    fan_in = their_shape[1] * math.prod(their_shape[2:])
    return math.sqrt(2.0) * math.sqrt(3.0 / fan_in)
