"""The CNN baseline of Sabour, Frosst & Hinton (2017), section 5, for the CapsNet-vs-CNN comparisons."""
from __future__ import annotations

from tinygrad_caps import functional as F
from tinygrad_caps import nn

from .config import BaselineCNNConfig, keyword_signature
from .image_batch import image_batch


class BaselineCNN(nn.Module):
    """Three 5x5 stride-1 ReLU convolutions (256, 256, 128 channels), fully connected layers of 328
    and 192 ReLU units, dropout, and a linear layer to the class logits (trained with cross-entropy).

    The paper leaves open the padding, the pooling, the dropout rate and the initialization. We
    use padding 2 ("same") and no pooling, the one layout that reproduces the paper's stated
    35.4M parameters at 28x28 (128*28*28*328 weights in the first fully connected layer alone;
    pooling or "valid" padding would give far fewer); dropout 0.5; PyTorch's default
    initialization. (The official code's ``conv_model.py`` baseline differs from the paper: 512
    and 256 channels with 2x2 max pooling and one 1024-unit layer.)

    Parameters: conv1/conv2/conv3.weight (out, in, 5, 5) and .bias, fc1/fc2/fc3.weight (out, in) and .bias.
    ``channels``, ``hidden`` and ``dropout`` change the sizes for small experiments.
    """

    def __init__(self, config: BaselineCNNConfig | dict | None = None, **overrides):
        """``config`` (a BaselineCNNConfig, or its dict form; default: the paper's sizes) with
        ``overrides`` (its fields as keywords: in_channels, image_size, num_classes, channels, hidden,
        dropout) applied."""
        super().__init__()
        self.config = BaselineCNNConfig.resolved(config, **overrides)
        in_channels, image_size, num_classes, channels, hidden, dropout = (
            getattr(self.config, name) for name in ("in_channels", "image_size", "num_classes", "channels", "hidden",
                                                    "dropout"))
        self.dropout = dropout
        self.conv1 = nn.Conv2d(in_channels, channels[0], 5, padding=2)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5, padding=2)
        self.conv3 = nn.Conv2d(channels[1], channels[2], 5, padding=2)
        self.fc1 = nn.Linear(channels[2] * image_size * image_size, hidden[0])
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.fc3 = nn.Linear(hidden[1], num_classes)

    @classmethod
    def from_config(cls, config: BaselineCNNConfig) -> "BaselineCNN":
        """The network ``config`` describes."""
        return cls(config)

    @property
    def device(self) -> str:
        """The device the parameters live on ("cpu" or "cuda")."""
        return self.conv1.weight.device

    def forward(self, x):
        """x (B, C, H, W) images -> (B, num_classes) logits (dropout only in training mode)."""
        x = image_batch(x, self.config, self.conv1.weight.dtype, "BaselineCNN")
        h = F.relu(self.conv3(F.relu(self.conv2(F.relu(self.conv1(x))))))
        h = F.relu(self.fc1(F.reshape(h, (x.shape[0], -1))))
        h = F.relu(self.fc2(h))
        return self.fc3(F.dropout(h, self.dropout, self.training))


BaselineCNN.__init__.__signature__ = keyword_signature(BaselineCNNConfig)
