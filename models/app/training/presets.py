"""Named sets of training options for ``tinygrad-caps train --preset NAME``; options given on the
command line win over the preset's."""
from __future__ import annotations

from ...capsnet.config import MODEL_OPTIONS, CapsNetConfig
from ...capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT
from .config import PRESET_NAMES, TrainingConfig

# Steps per epoch of the official code on MNIST: 60,000 images in batches of 128.
_OFFICIAL_STEPS_PER_EPOCH = 60000 / 128

SABOUR_OFFICIAL = dict(
    conventions="official",
    leaky_routing=False,
    routing_iterations=3,
    routing_gradient="full",
    batch_size=128,
    lr=1e-3,
    lr_decay=0.96 ** (_OFFICIAL_STEPS_PER_EPOCH / 2000),
    reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT,
    augment="shift",
    epochs=640,
)
"""The authors' own runs (Sarasra/models, research/capsules), option by option, with the source of each:

- conventions="official": biases in every capsule layer, PrimaryCaps as a one-iteration capsule
  layer, truncated-normal initialization, the official margin-loss scaling (models/capsule_model.py
  ``CapsuleModel``, models/layers/layers.py ``capsule``, ``conv_slim_capsule``, ``_margin_loss``,
  ``evaluate``, models/layers/variables.py).
- leaky_routing=False for MNIST-like data: experiment.py ``default_hparams`` has ``leaky=False``;
  its README trains CIFAR-10 with ``leaky=true`` (the paper's "none-of-the-above" category), so
  with ``--dataset cifar10`` the preset turns it on and uses its 64 primary capsule types
  (``num_prime_capsules=64``); that command's ``padding=SAME`` and ``remake=false`` (no
  decoder) have no counterpart here and are not reproduced.
- routing_iterations=3: ``default_hparams`` ``routing=3`` (the paper: 3 iterations).
- routing_gradient="full": ``_update_routing`` runs a ``tf.while_loop`` with no stop-gradient.
- batch_size=128: experiment.py ``train`` reads batches of 128.
- lr=1e-3 with Adam: ``default_hparams`` ``learning_rate=0.001``; models/model.py ``Model`` uses
  ``tf.train.AdamOptimizer``.
- lr_decay: models/model.py decays the rate by 0.96 every 2,000 steps, continuously
  (``exponential_decay`` without staircase), floored at 1e-6. Our schedule steps once per epoch,
  so the preset uses 0.96 ** (468.75 / 2000) per epoch, exact for a 60,000-image training set
  of MNIST size; the 1e-6 floor is not reproduced (it is reached only after ~675,000 steps).
- reconstruction_weight, the paper's: layers.py ``reconstruction`` ``balance_factor`` in capsule_model.py.
- augment="shift": input_data/mnist/mnist_input_record.py pads and random-crops, i.e. shifts by
  up to 2 pixels (the paper: "shifted by up to 2 pixels in each direction with zero padding").
- epochs=640: the README's MNIST command trains ``--max_steps=300000`` steps of 128 images,
  300,000 * 128 / 60,000 = 640 epochs.
Not established and therefore not part of the preset: the decoder (always the fully connected
one, our default), the weight decay (none in the official code) and the dtype (float32, ours).
"""

CIFAR10 = dict(dataset="cifar10", primary_types=64, leaky_routing=True)
"""Sabour, Frosst and Hinton (2017), section 7, what they changed for CIFAR-10: 64 primary capsule
types instead of 32, and a "none-of-the-above" category for the routing softmax (our
``leaky_routing``); the 24x24 patches are the cifar10 dataset's own preprocessing (the registry's)."""

PRESETS = {"sabour-official": SABOUR_OFFICIAL, "cifar10": CIFAR10}



def check_model_options(options: dict) -> dict:
    """``options`` with each model option checked against its CapsNetConfig field and each training
    option against its TrainingConfig field (ValueError naming it)."""
    for name in MODEL_OPTIONS:
        if name in options:
            CapsNetConfig.check_option(name, options[name])
    TrainingConfig().replace(**{k: v for k, v in options.items() if k not in MODEL_OPTIONS})
    return options


for _options in PRESETS.values():
    check_model_options(_options)


def preset_options(name: str, dataset: str | None = None) -> dict:
    """The training options of preset ``name`` (a fresh dict); ``dataset`` adjusts those the
    official code sets per dataset (leaky routing for CIFAR-10)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {tuple(PRESETS)}")
    options = dict(PRESETS[name])
    if name == "sabour-official" and dataset == "cifar10":
        options.update(leaky_routing=True, primary_types=64)
    return check_model_options(options)
