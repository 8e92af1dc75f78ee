"""The same CapsNet in plain PyTorch (eager), for the speed comparisons in train_step.py."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as tf

from tinygrad_caps.models.capsnet import DEFAULT_RECONSTRUCTION_WEIGHT


def squash(s, eps=1e-8):
    sq = (s * s).sum(-1, keepdim=True)
    return sq / (1 + sq) * s / torch.sqrt(sq + eps)


class TorchCapsNet(torch.nn.Module):
    """CapsNet with the paper's sizes and the parameter names of tinygrad_caps.models.CapsNet."""

    def __init__(self, in_channels=1, image_size=28, num_classes=10, iterations=3, conv1_channels=256, types=32,
                 dim=8, digit_dim=16, kernel_size=9):
        super().__init__()
        self.types, self.dim, self.iterations = types, dim, iterations
        self.conv1 = torch.nn.Conv2d(in_channels, conv1_channels, kernel_size)
        self.primary = torch.nn.Conv2d(conv1_channels, types * dim, kernel_size, stride=2)
        size = (image_size - kernel_size + 1 - kernel_size) // 2 + 1
        self.digit = torch.nn.Module()
        self.digit.weight = torch.nn.Parameter(0.01 * torch.randn(types * size * size, num_classes, digit_dim, dim))
        self.decoder = torch.nn.Module()
        self.decoder.fc1 = torch.nn.Linear(num_classes * digit_dim, 512)
        self.decoder.fc2 = torch.nn.Linear(512, 1024)
        self.decoder.fc3 = torch.nn.Linear(1024, in_channels * image_size * image_size)

    def forward(self, x, y):
        h = tf.relu(self.conv1(x))
        p = self.primary(h)
        b, _, hh, ww = p.shape
        u = squash(p.view(b, self.types, self.dim, hh, ww).permute(0, 1, 3, 4, 2).reshape(b, -1, self.dim))
        u_hat = torch.einsum("ijdk,bik->bijd", self.digit.weight, u)
        logits = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype, device=u_hat.device)
        for r in range(self.iterations):
            v = squash(torch.einsum("bij,bijd->bjd", torch.softmax(logits, dim=2), u_hat))
            if r < self.iterations - 1:
                logits = logits + torch.einsum("bijd,bjd->bij", u_hat, v)
        lengths = torch.sqrt((v * v).sum(-1) + 1e-8)
        mask = tf.one_hot(y, v.shape[1]).to(v.dtype)
        d = tf.relu(self.decoder.fc2(tf.relu(self.decoder.fc1((v * mask[..., None]).reshape(b, -1)))))
        recon = torch.sigmoid(self.decoder.fc3(d))
        margin = (mask * tf.relu(0.9 - lengths) ** 2 + 0.5 * (1 - mask) * tf.relu(lengths - 0.1) ** 2).sum(1)
        return (margin + DEFAULT_RECONSTRUCTION_WEIGHT * ((recon - x.reshape(b, -1)) ** 2).sum(1)).mean()

    def load_arrays(self, state: dict):
        """Copy a tinygrad_caps CapsNet state_dict (arrays) into this module."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(torch.from_numpy(np.asarray(state[name])))
