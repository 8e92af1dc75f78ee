"""CapsNet (Sabour, Frosst & Hinton 2017): Conv1, PrimaryCaps, DigitCaps with dynamic routing,
and a reconstruction decoder. Sizes derive from the arguments; the defaults are the paper's."""
from __future__ import annotations

from typing import NamedTuple


import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps import nn

from .config import CapsNetConfig, keyword_signature
from .decoders import decoder_parameter_count, make_decoder
from .image_batch import image_batch
from .initialization import CAPSULE_INITS
from .losses import (DEFAULT_RECONSTRUCTION_WEIGHT, SPREAD_MARGIN_END, TrainingPosition, scheduled_spread_margin,
                     spread_margin, training_loss)
from .primary_activations import PrimaryActivations
from .recipes import inverse_temperature_schedule
from .routing import (LENGTH_EPS, CapsuleLayer, DigitCaps, EMRoutingLayer, capsule_lengths, routing_layer,
                      routing_parameter_count)
from .squash import squash_function

__all__ = ["LENGTH_EPS", "CapsNet", "CapsNetOutput", "CapsuleLayer", "DigitCaps", "PrimaryCaps", "feature_map_sizes"]


class _OutputFields(NamedTuple):
    v: tc.Tensor
    lengths: tc.Tensor
    reconstruction: tc.Tensor
    couplings: list | None = None
    traces: list | None = None


class CapsNetOutput(_OutputFields):
    """What ``CapsNet.forward`` returns: ``v`` (B, num_classes, digit_dim), ``lengths`` (B, num_classes),
    ``reconstruction`` (B, C*H*W), ``couplings`` (DigitCaps' coefficients per iteration, or None) and
    ``traces`` (a RoutingTrace per routing layer, or None); the last two only when asked for.

    As a sequence it holds what was asked for, as forward returned before it had names:
    ``v, lengths, reconstruction = model(x)``; with ``return_trace`` ``outputs[3]`` is the traces,
    with ``return_coupling`` the couplings, with both (v, lengths, reconstruction, couplings,
    traces). The names always reach all five.
    """

    __slots__ = ()

    def _asked(self) -> tuple:
        fields = tuple.__iter__(self)
        return tuple(value for k, value in enumerate(fields) if k < 3 or value is not None)

    def __iter__(self):
        return iter(self._asked())

    def __len__(self) -> int:
        return len(self._asked())

    def __getitem__(self, index):
        return self._asked()[index]

    def __getnewargs__(self):
        return tuple(tuple.__iter__(self))

    def _asdict(self) -> dict:
        return dict(zip(self._fields, tuple.__iter__(self)))

    def _replace(self, **changes):
        return type(self)(**{**self._asdict(), **changes})


class PrimaryCaps(nn.Module):
    """A convolution whose channels are ``types`` capsule types of ``dim`` values each.

    Channel ``c = type * dim + component``. The (B, types*dim, H, W) map becomes (B, types, dim,
    H, W), is permuted to (B, types, H, W, dim) so that one capsule's components stay together,
    then flattened to (B, types*H*W, dim) and squashed. A ``coupling`` other than 1 multiplies
    the convolution before its bias (the official code's one-iteration routing, see CapsNet).
    ``squash`` is the nonlinearity (a function over the last axis; default Sabour et al.'s).
    """

    @staticmethod
    def parameter_count(in_channels, types, dim, kernel_size) -> int:
        """The number of parameters of ``PrimaryCaps(in_channels, types, dim, kernel_size)``: its convolution's."""
        return nn.Conv2d.parameter_count(in_channels, types * dim, kernel_size)

    def __init__(self, in_channels, types, dim, kernel_size, stride=2, coupling=1.0, squash=None):
        super().__init__()
        self.types, self.dim, self.stride, self.coupling = types, dim, stride, coupling
        self.squash = squash or squash_function()
        conv = nn.Conv2d(in_channels, types * dim, kernel_size)  # for PyTorch's default initialization
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x):
        if self.coupling == 1.0:
            y = F.conv2d(x, self.weight, self.bias, stride=self.stride)
        else:
            y = F.conv2d(x, self.weight, None, stride=self.stride) * self.coupling
            y = y + F.reshape(self.bias, (1, -1, 1, 1))
        batch, _, h, w = y.shape
        y = F.reshape(y, (batch, self.types, self.dim, h, w))
        y = F.permute(y, (0, 1, 3, 4, 2))
        return self.squash(F.reshape(y, (batch, self.types * h * w, self.dim)))


def feature_map_sizes(image_size: int, kernel_size: int) -> tuple[int, int]:
    """(conv1's output side, PrimaryCaps' output side): a valid convolution, then one with stride 2.
    Either is below 1 when the image is too small for the two."""
    conv1_size = image_size - kernel_size + 1
    return conv1_size, (conv1_size - kernel_size) // 2 + 1


class CapsNet(nn.Module):
    """The CapsNet of the paper, with every size taken from its CapsNetConfig (``model.config``), and
    its research variants.

    Parameters (shapes at the defaults): conv1.weight (256, C, 9, 9), conv1.bias, primary.weight
    (256, 256, 9, 9), primary.bias, digit.weight (1152, 10, 16, 8), decoder.fc1/fc2/fc3.weight
    (out, in) and .bias.

    Variants (the defaults give the paper's model):
        hidden_capsules: (count, dim) pairs, fully connected capsule layers between PrimaryCaps and
            DigitCaps (``hidden.0``, ``hidden.1``, ...), each with weight (in_caps, count, dim,
            in_dim) and its own routing with the same iterations and gradient mode as DigitCaps.
        capsule_bias: a learned bias per output capsule of every routing layer (``hidden.k.bias``
            (count, dim), ``digit.bias`` (num_classes, digit_dim)), zero at initialization, added
            before the squash in every iteration (Peer et al. 2019).
        routing: a registered routing (``routing.routing_names()``): "dynamic" (Procedure 1),
            "uniform" (c = 1/J, no iterations), "em" (EM routing), "self-attention", "self-routing",
            or one of your own (``register_routing``); ``em_inverse_temperature`` is EM routing's lambda.
            EM routing and self-routing give output
            activations: DigitCaps' are the class scores (``lengths``), and each layer above one of
            theirs takes them as its input activations.
        conventions: "paper" (the paper's equations) or "official" (the authors' TensorFlow code,
            Sarasra/models research/capsules): every routing layer gets a bias initialized to 0.1
            (the same parameter ``capsule_bias`` adds), PrimaryCaps scales its convolution by its
            one-iteration coupling 1/types before its bias, and weights are drawn from a normal
            truncated at 2 standard deviations (0.05 for conv1, 0.1 otherwise) with biases 0.1.
        leaky_routing: an extra zero logit in every softmax over output capsules ("none of the above").
        squash, squash_eps: the nonlinearity of PrimaryCaps and every routing layer, by name
            (``squash.SQUASHES``: "sabour", the paper's, or "peer", Peer et al.'s code's, linear near 0).
        capsule_init: how the routing layers start (``initialization.CAPSULE_INITS``): "default" (as
            above), "peer" (Peer et al.'s code: weights N(0, 0.2), biases 0.1), "he-normal"
            (Efficient-CapsNet's) or "kaiming-uniform" (SR-CapsNet's), applied after the conventions'
            initialization.
        recipe: the parts around the routing (``recipes.py``; ``recipe_parts``): "common" (every routing
            alike, the model as it was before recipes) or "authors" (the routing's authors' own); the
            parts ``input_activations`` ("lengths", or "learned": ``primary_activations``, a sigmoid of a
            batch-normed convolution beside PrimaryCaps, the first routing layer's input activations),
            ``class_loss`` (what ``loss`` computes), ``capsule_init``, ``squash`` and
            ``em_inverse_temperature`` (a number, one per iteration or "paper") may each be set, and
            win; their default "recipe" takes the recipe's.

    ``loss(output, images, labels)`` is the recipe's training loss; a spread loss takes its margin
    from its schedule (``spread_margin_schedule``) at ``training_position`` (a
    ``losses.TrainingPosition``: the step, the batches an epoch and the epochs of the run, which the
    Trainer sets before every step with ``set_training_position``). A model that is not training has
    none and takes the final margin 0.9; ``training_progress`` (the share of the run's steps done,
    1.0 by default) stands in for the position under the paper's schedule only.
    """

    training_progress = 1.0
    training_position = None

    def __init__(self, config: CapsNetConfig | dict | None = None, **overrides):
        """``config`` (a CapsNetConfig, or its dict form; default: the paper's network) with ``overrides``
        (CapsNetConfig's fields as keywords, e.g. ``CapsNet(routing_iterations=1)``) applied."""
        super().__init__()
        self.config = c = CapsNetConfig.resolved(config, **overrides)
        self.recipe_parts = parts = c.recipe_parts()
        in_channels, image_size, num_classes, kernel_size = c.in_channels, c.image_size, c.num_classes, c.kernel_size
        primary_types, primary_dim, conv1_channels = c.primary_types, c.primary_dim, c.conv1_channels
        hidden_capsules, routing, leaky_routing = c.hidden_capsules, c.routing, c.leaky_routing
        conv1_size, primary_size = feature_map_sizes(image_size, kernel_size)
        if conv1_size < 1 or primary_size < 1:
            raise ValueError(f"CapsNet: image_size {image_size} is too small for two {kernel_size}x{kernel_size} convolutions")
        official = c.conventions == "official"
        self.num_primary = primary_types * primary_size * primary_size
        self.conv1 = nn.Conv2d(in_channels, conv1_channels, kernel_size)
        # The official PrimaryCaps is a capsule layer with one routing iteration: its c = softmax(0)
        # over the capsule types (plus the leak) multiplies the convolution before the bias.
        primary_coupling = 1.0 / (primary_types + (1 if leaky_routing else 0)) if official else 1.0
        nonlinearity = squash_function(parts.squash, c.squash_eps)
        self.primary = PrimaryCaps(conv1_channels, primary_types, primary_dim, kernel_size, stride=2,
                                   coupling=primary_coupling, squash=nonlinearity)
        layer_options = dict(iterations=c.routing_iterations, gradient=c.routing_gradient,
                             bias=c.capsule_bias or official, leaky_routing=leaky_routing, squash=nonlinearity)
        in_caps, in_dim = self.num_primary, primary_dim
        self.hidden = nn.Sequential(*[routing_layer(routing, in_caps if k == 0 else hidden_capsules[k - 1][0],
                                                    in_dim if k == 0 else hidden_capsules[k - 1][1],
                                                    count, dim, **layer_options)
                                      for k, (count, dim) in enumerate(hidden_capsules)])
        if hidden_capsules:
            in_caps, in_dim = hidden_capsules[-1]
        if routing in ("dynamic", "uniform"):
            self.digit = DigitCaps(in_caps, in_dim, num_classes, c.digit_dim, routing=routing, **layer_options)
        else:
            self.digit = routing_layer(routing, in_caps, in_dim, num_classes, c.digit_dim, **layer_options)
        self.decoder = make_decoder(c.decoder, num_classes * c.digit_dim, in_channels, image_size, c.decoder_hidden)
        # made last, so that the other layers draw the same initial values with either input activations
        self.primary_activations = (PrimaryActivations(conv1_channels, primary_types, kernel_size, stride=2)
                                    if parts.input_activations == "learned" else None)
        lambdas = inverse_temperature_schedule(parts.em_inverse_temperature, c.routing_iterations)
        for _, layer in self.routing_layers():
            if isinstance(layer, EMRoutingLayer):
                layer.inverse_temperature = lambdas if len(set(lambdas)) > 1 else lambdas[0]
                layer.set_em_options(c.em_cost_scale, c.em_initial_assignment)
        if official:
            self._official_initialization()
        CAPSULE_INITS[parts.capsule_init](self.routing_layers())

    @classmethod
    def from_config(cls, config: CapsNetConfig) -> "CapsNet":
        """The network ``config`` describes."""
        return cls(config)

    def _official_initialization(self):
        """Sarasra/models research/capsules, models/layers/variables.py: weight_variable draws from a
        normal truncated at two standard deviations (stddev 0.1; 5e-2 for conv1 in
        capsule_model.py inference), bias_variable is the constant 0.1; the reconstruction's fully
        connected layers (layers.py reconstruction) use the same two initializers."""
        for name, p in self.named_parameters():
            if name.startswith("decoder.") and self.config.decoder != "fc":
                continue  # the official code has only the fully connected decoder
            if name.startswith("primary_activations."):
                continue  # nor learned input activations
            if name.endswith("bias"):
                nn.init.constant_(p, 0.1)
            else:
                std = 5e-2 if name == "conv1.weight" else 0.1
                nn.init.trunc_normal_(p, 0.0, std, -2 * std, 2 * std)

    @classmethod
    def parameter_count(cls, config=None, **overrides) -> int:
        """The number of parameters of ``CapsNet(config, **overrides)``, summed from its layers' own
        counts without building it (so a model too large for the machine can be sized first).
        ValueError where the image is too small for the two convolutions."""
        c = CapsNetConfig.resolved(config, **overrides)
        conv1_size, primary_size = feature_map_sizes(c.image_size, c.kernel_size)
        if conv1_size < 1 or primary_size < 1:
            raise ValueError(f"CapsNet: image_size {c.image_size} is too small for two {c.kernel_size}x"
                             f"{c.kernel_size} convolutions")
        bias = c.capsule_bias or c.conventions == "official"
        count = (nn.Conv2d.parameter_count(c.in_channels, c.conv1_channels, c.kernel_size)
                 + PrimaryCaps.parameter_count(c.conv1_channels, c.primary_types, c.primary_dim, c.kernel_size))
        if c.recipe_parts().input_activations == "learned":
            count += PrimaryActivations.parameter_count(c.conv1_channels, c.primary_types, c.kernel_size)
        layers = [(c.primary_types * primary_size * primary_size, c.primary_dim), *c.hidden_capsules,
                  (c.num_classes, c.digit_dim)]
        for (in_caps, in_dim), (out_caps, out_dim) in zip(layers, layers[1:]):
            count += routing_parameter_count(c.routing, in_caps, in_dim, out_caps, out_dim, bias)
        return count + decoder_parameter_count(c.decoder, c.num_classes * c.digit_dim, c.in_channels, c.image_size,
                                            c.decoder_hidden)

    def routing_layers(self) -> list:
        """(name, layer) for every routing layer, bottom to top: ("hidden.0", ...), ..., ("digit", ...)."""
        return [(f"hidden.{k}", layer) for k, layer in enumerate(self.hidden)] + [("digit", self.digit)]

    @property
    def device(self) -> str:
        """The device the parameters live on ("cpu" or "cuda")."""
        return self.digit.weight.device

    def forward(self, x, y=None, return_coupling=False, return_trace=False):
        """Classify and reconstruct.

        Args:
            x: (B, C, H, W) images. y: (B,) integer labels, or None.
        Returns:
            v (B, num_classes, digit_dim), lengths (B, num_classes), the class scores: sqrt(|v|^2 + 1e-8),
            or DigitCaps' output activations where its routing has them (EM routing, self-routing); and the
            reconstruction (B, C*H*W) from v masked by ``y`` when given, else by the longest capsule.
            With ``return_coupling``, also DigitCaps' routing coefficients of every iteration; with
            ``return_trace``, also a list of RoutingTrace, one per routing layer, bottom to top
            (names in ``routing_layers()``). Both: (v, lengths, reconstruction, couplings, traces).
            All of it as a CapsNetOutput (see there for how it unpacks).
        """
        x = image_batch(x, self.config, self.digit.weight.dtype, "CapsNet")
        features = F.relu(self.conv1(x))
        u = self.primary(features)
        activations = None if self.primary_activations is None else self.primary_activations(features)
        traces = []
        for name, layer in self.routing_layers():
            routed = layer.route(u, activations, trace=return_trace or (return_coupling and name == "digit"))
            u, activations = routed.poses, routed.activations
            if routed.trace is not None and return_trace:
                routed.trace.name = name
                traces.append(routed.trace)
        couplings = list(routed.trace.coupling) if return_coupling else None
        v = u
        lengths = capsule_lengths(v) if activations is None else activations
        if y is None:
            chosen = lengths.xp.argmax(lengths.data, axis=1)
        else:
            chosen = tc.backend.asarray_like(y.data if isinstance(y, tc.Tensor) else y, lengths.data)
        mask = F.one_hot(chosen, self.config["num_classes"], dtype=x.dtype)
        reconstruction = self.decoder(F.reshape(v * F.expand_dims(mask, -1), (x.shape[0], -1)))
        return CapsNetOutput(v, lengths, reconstruction, couplings, traces if return_trace else None)

    @property
    def loss_follows_progress(self) -> bool:
        """Whether ``loss`` changes with the run's position (the spread loss's margin schedule)."""
        return self.recipe_parts.class_loss == "spread"

    def set_training_position(self, step: int, steps_per_epoch: int, epochs: int) -> None:
        """Where the run is before a step: ``step`` global steps done, ``steps_per_epoch`` batches an
        epoch, ``epochs`` epochs in the run (a ``TrainingPosition``; also sets ``training_progress``)."""
        self.training_position = position = TrainingPosition(step, steps_per_epoch, epochs)
        self.training_progress = position.progress

    def spread_margin(self, progress: float | None = None) -> float:
        """The spread loss's margin now: under the paper's schedule at ``progress`` where given, else
        the schedule's at ``training_position``; a model with no position takes ``training_progress``
        under the paper's schedule and the final margin 0.9 under the others. ValueError for
        ``progress`` with a schedule that reads the step or the epoch."""
        schedule = self.recipe_parts.spread_margin_schedule
        if progress is not None:
            if schedule != "paper":
                raise ValueError(f"CapsNet.loss: progress is the paper schedule's; the {schedule} margin schedule "
                                 "reads the step and the epoch: set them with set_training_position")
            return spread_margin(progress)
        if self.training_position is not None:
            return scheduled_spread_margin(schedule, self.training_position)
        return spread_margin(self.training_progress) if schedule == "paper" else scheduled_spread_margin(schedule, None)

    def loss(self, output, images, labels, reconstruction_weight: float = DEFAULT_RECONSTRUCTION_WEIGHT, *,
             progress: float | None = None, return_terms: bool = False):
        """The recipe's training loss of one batch: the batch mean of the class loss (``class_loss``:
        the margin loss in the model's ``conventions``, the spread loss, or the NLL) on the class
        scores plus ``reconstruction_weight`` times the reconstruction loss; for the common recipe
        exactly ``capsule_loss``.

        Args:
            output: what ``forward`` returned (a CapsNetOutput: ``lengths`` (B, K), ``reconstruction``
                (B, C*H*W)). images: (B, C, H, W), a Tensor or array. labels: (B,) integer classes.
            progress: the share of the run's steps done, in [0, 1], for the paper schedule's margin
                0.2 + 0.7 progress (default: the margin ``spread_margin()`` gives now).
        Returns:
            A scalar Tensor; with ``return_terms``, ``(loss, class loss (B,), reconstruction loss (B,))``.
        """
        margin = self.spread_margin(progress) if self.loss_follows_progress else SPREAD_MARGIN_END
        return training_loss(output.lengths, output.reconstruction, images, labels, self.recipe_parts.class_loss,
                             reconstruction_weight, convention=self.config.conventions, margin=margin,
                             return_terms=return_terms)


CapsNet.__init__.__signature__ = keyword_signature(CapsNetConfig)
