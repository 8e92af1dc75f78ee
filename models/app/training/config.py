"""The options of a training run, written once: ``TrainingConfig``.

Each field is one ``train`` option with its default, its allowed values, a line of help and what
``--resume`` does with it (in the field's metadata, as ``CapsNetConfig``'s fields carry theirs).
The ``train`` parser and ``study run``'s shared options (``cli.training_options``), the rules of
``--resume`` (``MAY_CHANGE_ON_RESUME``, ``LAUNCH_OPTIONS``), the options a study's configuration
may set (``STUDY_OPTIONS``), the CapsNet-only options, the checks of a run's ``config.json`` (the
Trainer reads a TrainingConfig) and of the presets, and the options table of docs/training.md
(``cli.training_options.options_table_markdown``) are derived from this class: a new training
option is one new field here, and its use in the Trainer.

A run's ``config.json`` is flat: these options, the model's (``CapsNetConfig`` or
``BaselineCNNConfig``, as ``model`` says), the dataset's geometry and the version that wrote it.
``TrainingConfig.from_dict`` reads that form, including the files of earlier versions, into the
training fields and ``network`` (the model's part); ``to_dict`` writes it back. An unknown key or a
bad value is a ``ValueError`` naming the field.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import numpy as np

from tinygrad_caps.cuda_graphs import MODES as CUDA_GRAPH_MODES
from tinygrad_caps.ops.linalg import PRECISIONS

from ...capsnet.config import MODEL_CONFIGS, MappingView, OptionError, UnknownOptionError
from ...capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT
from .threads import MAX_THREADS

MAX_LOSS_WEIGHT = 1000.0
MAX_SEED = 2 ** 63 - 1
AUGMENTATIONS = ("default", "none", "shift", "shift+flip")
PRESET_NAMES = ("sabour-official", "cifar10")
GEOMETRY_KEYS = ("in_channels", "image_size", "num_classes")
NOT_OPTIONS = ("version",)  # written into config.json beside the options

# What --resume does with an option given again with another value (a field's "resume"):
MAY_CHANGE = "may change"   # where and how long the run goes on, not what it computes: taken, and printed
LAUNCH = "launch"           # how the processes were started: always the command line's
FIXED = "fixed"             # what the run computes: refused
RESTORED = "restored"       # how the run computes, to the last bit: the run's own unless given again; another
                            # value is taken, with a warning that the results then differ in their last bits


def option(default, kind: str, help: str, *, resume: str = FIXED, capsnet_only: bool = False, study: bool = True,
           optional: bool = False, metavar: str | None = None, **rule):
    """A training option: ``kind`` ("int", "real", "choice", "bool", "text") with its ``rule``
    (``low``/``high`` and which ends are open for numbers, ``choices``), None allowed where
    ``optional``; ``resume`` its rule on --resume, ``capsnet_only`` whether only a CapsNet uses it,
    ``study`` whether a study's configuration may set it."""
    metadata = dict(kind=kind, help=help, resume=resume, capsnet_only=capsnet_only, study=study, optional=optional,
                    metavar=metavar, **rule)
    return dataclasses.field(default=default, metadata=metadata)


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _shown(value) -> str:
    text = repr(value)
    return type(value).__name__ + (f" {text}" if len(text) < 40 else "")


def range_text(meta) -> str:
    """A number option's range as written in help and errors: "in (0, 1]", ">= 1", "in [0, 2**63 - 1]"."""
    low, high = meta.get("low"), meta.get("high")
    if high is None:
        return f">= {low}" if not meta.get("open_low") else f"> {low}"
    shown = "2**63 - 1" if high == MAX_SEED else f"{high:g}"
    return f"in {'(' if meta.get('open_low') else '['}{low:g}, {shown}{')' if meta.get('open_high') else ']'}"


def checked(field: dataclasses.Field, value):
    """``value`` as field ``field`` holds it; ValueError saying why it is not allowed."""
    meta = field.metadata
    kind = meta["kind"]
    if value is None and meta["optional"]:
        return None
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"must be true or false, got {_shown(value)}")
        return bool(value)
    if kind == "choice":
        if value not in meta["choices"] or isinstance(value, bool):
            raise ValueError(f"must be one of {', '.join(map(str, meta['choices']))}, got {_shown(value)}")
        return value
    if kind == "text":
        if not isinstance(value, str) or (not value and not meta.get("empty")):
            raise ValueError(f"must be a non-empty string, got {_shown(value)}")
        return value
    if kind == "int" and not _is_integer(value):
        raise ValueError(f"must be an integer, got {_shown(value)}")
    if kind == "real" and (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)
                           or not math.isfinite(value)):
        raise ValueError(f"must be a finite number, got {_shown(value)}")
    low, high = meta["low"], meta.get("high")
    below = value <= low if meta.get("open_low") else value < low
    above = high is not None and (value >= high if meta.get("open_high") else value > high)
    if below or above:
        if kind == "int" and low == 1 and high is None:
            raise ValueError(f"must be a positive integer, got {value}")
        raise ValueError(f"must lie {range_text(meta)}, got {value}")
    return int(value) if kind == "int" else float(value)


@dataclass(frozen=True)
class TrainingConfig(MappingView):
    """One training run's options (the ``train`` command's), and ``network``: the model options and
    geometry the run records (keys of ``CapsNetConfig`` or ``BaselineCNNConfig``, as ``model`` says).

    Frozen; ``replace(**changes)`` gives a checked copy. ``from_dict``/``to_dict`` convert from and to
    the flat form of ``config.json``.
    """

    model: str = option("capsnet", "choice", "CapsNet or the paper's baseline CNN", choices=tuple(MODEL_CONFIGS))
    dataset: str = option("fashion-mnist", "text", "a registered dataset, or the name of a folder of IDX files "
                                                   "under --data-dir")
    data_dir: str = option(None, "text", "where the dataset's files are (imagefolder: PATH with train/, test/)",
                           optional=True, resume=MAY_CHANGE)
    image_size: int = option(None, "int", "imagefolder: resize to N x N (default 32)", optional=True, low=1)
    channels: int = option(None, "choice", "imagefolder: 1 (gray) or 3 (RGB, default)", optional=True,
                           choices=(1, 3))
    epochs: int = option(30, "int", "epochs to train (on --resume: extend or shorten the run)", low=1,
                         resume=MAY_CHANGE)
    batch_size: int = option(100, "int", "images per training step and per test batch", low=1)
    lr: float = option(1e-3, "real", "Adam's learning rate, in (0, 1]", low=0.0, high=1.0, open_low=True)
    lr_decay: float = option(0.9, "real", "ExponentialLR gamma in (0, 1], applied after each epoch", low=0.0,
                             high=1.0, open_low=True)
    reconstruction_weight: float = option(DEFAULT_RECONSTRUCTION_WEIGHT, "real", "the reconstruction term's weight in the loss",
                                          low=0.0,
                                          high=MAX_LOSS_WEIGHT, capsnet_only=True)
    augment: str = option("default", "choice", "default: the dataset's (shift for MNIST-like data and image "
                                               "folders; none for smallnorb and cifar10, whose random crops are "
                                               "their augmentation)", choices=AUGMENTATIONS)
    seed: int = option(0, "int", "the seed of the initialisation, the shuffling and the augmentation", low=0,
                       high=MAX_SEED, study=False)
    dtype: str = option("float32", "choice", "the dtype of the weights and activations",
                        choices=("float32", "float64"))
    device: str = option("auto", "text", "auto (the GPU where there is one), cpu, cuda or cuda:N", resume=MAY_CHANGE)
    cuda_graph: str = option("auto", "choice", "capture the training step as a CUDA graph and replay it (GPU only; "
                                               "auto: where the step allows it, saying why not otherwise; on: fail "
                                               "where it cannot; the last, smaller batch of an epoch and logged "
                                               "gradflow steps run eagerly)", choices=CUDA_GRAPH_MODES,
                             resume=MAY_CHANGE)
    matmul_precision: str = option("highest", "choice", "GPU matrix products and convolutions in float32 (highest) "
                                                        "or TF32 tensor cores (high, PyTorch's default for cuDNN "
                                                        "convolutions); the CPU always computes in float32",
                                   choices=PRECISIONS)
    threads: int = option(None, "int", "engine and BLAS threads of the run (default: $TINYGRAD_CAPS_NUM_THREADS, "
                                       "else BLAS's own: $OPENBLAS_NUM_THREADS, $OMP_NUM_THREADS or the CPUs); "
                                       "recorded in config.json and restored by --resume, since BLAS's sums round "
                                       "by their thread count", optional=True, low=1,
                          high=MAX_THREADS, resume=RESTORED, study=False, metavar="N")
    limit_train: int = option(None, "int", "the first N training images only", optional=True, low=1)
    limit_test: int = option(None, "int", "the first N test images only", optional=True, low=1)
    log_gradflow: int = option(None, "int", "every N batches, append that batch's routing statistics and "
                                            "per-iteration gradient norms to RUN/gradflow.jsonl", optional=True,
                               low=1, resume=MAY_CHANGE, capsnet_only=True, metavar="N")
    log_mode_cosine: bool = option(False, "bool", "with --log-gradflow: also the cosine between the logged step's "
                                                  "gradient and the other routing-gradient mode's (full or detach) "
                                                  "on the same batch and weights (one more forward and backward per "
                                                  "logged step; one process only)", resume=MAY_CHANGE,
                                   capsnet_only=True)
    tensorboard: str = option(None, "text", "also write TensorBoard event files (default folder RUN/tensorboard; "
                                            "needs tensorboardX: pip install -e '.[tensorboard]'): losses, accuracy, "
                                            "rate and images/s per logging interval, each epoch's metrics and "
                                            "reconstructions, and with --log-gradflow the routing figures and "
                                            "histograms of the couplings and gradients", optional=True, empty=True,
                              resume=MAY_CHANGE, study=False, metavar="DIR")
    preset: str = option(None, "choice", "sabour-official: the official code's conventions and training options; "
                                         "cifar10: Sabour et al.'s CIFAR-10 changes (64 primary capsule types, "
                                         "none-of-the-above); explicit options win", optional=True,
                         choices=PRESET_NAMES, study=False)
    distributed: bool = option(False, "bool", "data-parallel training over the processes that mpirun started "
                                              "(--batch-size is the global batch; rank 0 writes the files)",
                               resume=LAUNCH, study=False)
    sync_batchnorm: bool = option(False, "bool", "with --distributed: batch-norm statistics over the global batch "
                                                 "(default: per process)", resume=LAUNCH, study=False)
    network: dict = dataclasses.field(default_factory=dict, metadata=dict(kind="network", optional=False,
                                                                          resume=FIXED, study=False))

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.metadata["kind"] == "network":
                value = self._checked_network(value)
            else:
                try:
                    value = checked(field, value)
                except ValueError as exc:
                    raise OptionError("TrainingConfig", field.name, str(exc)) from None
            object.__setattr__(self, field.name, value)

    def _checked_network(self, network) -> dict:
        """The model's part, each option checked against the model's config class (geometry too), then
        the options together (a recipe part that does not apply to the routing: an OptionError naming it)."""
        if not isinstance(network, dict):
            raise OptionError("TrainingConfig", "network", f"must be a dict of model options, got {_shown(network)}")
        config_class = MODEL_CONFIGS[self.model]
        checked_network = {key: value if value is None else _json(config_class.check_option(key, value))
                           for key, value in network.items()}
        config_class.from_dict({key: value for key, value in checked_network.items() if value is not None})
        return checked_network

    @classmethod
    def option_fields(cls) -> list:
        """The fields that are ``train`` options (every field but ``network``)."""
        return [f for f in dataclasses.fields(cls) if f.metadata["kind"] != "network"]

    @classmethod
    def option_keys(cls, **where) -> tuple:
        """The names of the options whose metadata match ``where`` (e.g. ``resume=MAY_CHANGE``)."""
        return tuple(f.name for f in cls.option_fields() if all(f.metadata[k] == v for k, v in where.items()))

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingConfig":
        """The config of a run's ``config.json`` (or ``to_dict``'s form): the training options, and the
        model options and geometry into ``network``; ``version`` is left out. ValueError naming an
        unknown key or a bad value."""
        if not isinstance(d, dict):
            raise ValueError(f"TrainingConfig: a run's config is a JSON object, got {_shown(d)}")
        names = set(cls.option_keys())
        model = d.get("model") or "capsnet"
        if model not in MODEL_CONFIGS:
            raise OptionError("TrainingConfig", "model", f"must be one of {', '.join(MODEL_CONFIGS)}, got "
                                                         f"{_shown(model)}")
        model_keys = set(MODEL_CONFIGS[model].option_keys()) | set(GEOMETRY_KEYS)
        unknown = sorted(str(k) for k in d if k not in names | model_keys | set(NOT_OPTIONS))
        if unknown:
            raise UnknownOptionError(f"TrainingConfig: unknown option{'s' * (len(unknown) > 1)} "
                                     f"{', '.join(unknown)} (for --model {model})")
        options = {k: v for k, v in d.items() if k in names}
        if options.get("augment", "default") is None:  # config.json stores --augment none as null
            options["augment"] = "none"
        # image_size is both: an image folder's option, and the dataset's size in the geometry
        network = {k: v for k, v in d.items() if k in model_keys}
        return cls(**options, network=network)

    def to_dict(self) -> dict:
        """The flat form a run's ``config.json`` holds: every option (a CNN's run leaves out the CapsNet-only
        ones), then the model's options and geometry."""
        d = {f.name: getattr(self, f.name) for f in self.option_fields()
             if not (f.metadata["capsnet_only"] and self.model != "capsnet")}  # a CNN run records none
        d["augment"] = None if self.augment == "none" else self.augment
        d.update(self.network)
        return d

    def replace(self, **changes) -> "TrainingConfig":
        """A copy with ``changes`` (field names) applied and checked; UnknownOptionError for an unknown name."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UnknownOptionError(f"TrainingConfig: unknown option{'s' * (len(unknown) > 1)} {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)



def _json(value):
    """A model option as config.json stores it (sequences as lists)."""
    return [_json(v) for v in value] if isinstance(value, (tuple, list)) else value


MAY_CHANGE_ON_RESUME = TrainingConfig.option_keys(resume=MAY_CHANGE)
RESTORED_ON_RESUME = TrainingConfig.option_keys(resume=RESTORED)
LAUNCH_OPTIONS = TrainingConfig.option_keys(resume=LAUNCH)
CAPSULE_TRAINING_OPTIONS = TrainingConfig.option_keys(capsnet_only=True)
STUDY_OPTIONS = TrainingConfig.option_keys(study=True)
