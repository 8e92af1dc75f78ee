"""The CNN baseline of Sabour, Frosst & Hinton (2017), section 5, for the CapsNet-vs-CNN comparisons."""
from __future__ import annotations

from tinygrad_caps import functional as F
from tinygrad_caps import nn

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

    def __init__(self, in_channels=1, image_size=28, num_classes=10, channels=(256, 256, 128), hidden=(328, 192),
                 dropout=0.5):
        super().__init__()
        if len(channels) != 3 or len(hidden) != 2:
            raise ValueError(f"BaselineCNN: needs 3 convolution widths and 2 hidden sizes, got {channels} and {hidden}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"BaselineCNN: dropout must lie in [0, 1), got {dropout}")
        self.config = dict(model="cnn", in_channels=in_channels, image_size=image_size, num_classes=num_classes,
                           cnn_channels=[int(c) for c in channels], cnn_hidden=[int(h) for h in hidden],
                           dropout=float(dropout))
        self.dropout = dropout
        self.conv1 = nn.Conv2d(in_channels, channels[0], 5, padding=2)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5, padding=2)
        self.conv3 = nn.Conv2d(channels[1], channels[2], 5, padding=2)
        self.fc1 = nn.Linear(channels[2] * image_size * image_size, hidden[0])
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.fc3 = nn.Linear(hidden[1], num_classes)

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
