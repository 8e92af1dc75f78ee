"""The options of a training run, written once: ``TrainingConfig``.

Each field is one ``train`` option declared with ``tinygrad_caps.models.options.option``, as
``CapsNetConfig``'s fields are: its default, its allowed values, a line of help and, in its tags,
what ``--resume`` does with it, whether only a CapsNet uses it and whether a study may set it.
The ``train`` parser and ``study run``'s shared options (``cli.training_options``), the rules of
``--resume`` (``MAY_CHANGE_ON_RESUME``, ``LAUNCH_OPTIONS``), the options a study's configuration
may set (``STUDY_OPTIONS``), the CapsNet-only options, the checks of a run's ``config.json`` (the
Trainer reads a TrainingConfig) and of the presets, and the options table of docs/training.md
(``cli.training_options.options_table_markdown``) are derived from this class: a new training
option is one new field here, and its use in the part of the Trainer that reads it.

A run's ``config.json`` is flat: these options, the model's (``CapsNetConfig`` or
``BaselineCNNConfig``, as ``model`` says), the dataset's geometry and the version that wrote it.
``TrainingConfig.from_dict`` reads that form, including the files of earlier versions, into the
training fields and ``network`` (the model's part); ``to_dict`` writes it back. An unknown key or a
bad value is a ``ValueError`` naming the field.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from tinygrad_caps.cuda_graphs import MODES as CUDA_GRAPH_MODES
from tinygrad_caps.ops.linalg import PRECISIONS

from ...capsnet.config import MODEL_CONFIGS
from ...capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT
from ...errors import UsageError
from ...options import (BOOL, CHOICE, INT, POSITIVE, REAL, TEXT, OptionError, OptionsConfig, Range,
                        UnknownOptionError, json_form, option, option_flag, shown)
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


@dataclass(frozen=True)
class TrainingConfig(OptionsConfig):
    """One training run's options (the ``train`` command's), and ``network``: the model options and
    geometry the run records (keys of ``CapsNetConfig`` or ``BaselineCNNConfig``, as ``model`` says).

    Frozen; ``replace(**changes)`` gives a checked copy. ``from_dict``/``to_dict`` convert from and to
    the flat form of ``config.json``; ``model_config`` is the model's typed config, ``for_data(spec)``
    the config with the dataset's geometry.
    """

    TAGS = {"resume": FIXED, "capsnet_only": False, "study": True}

    model: str = option("capsnet", CHOICE, "CapsNet or the paper's baseline CNN", choices=tuple(MODEL_CONFIGS))
    dataset: str = option("fashion-mnist", TEXT, "a registered dataset, or the name of a folder of IDX files "
                                                   "under --data-dir")
    data_dir: str = option(None, TEXT, "where the dataset's files are (imagefolder: PATH with train/, test/)",
                           optional=True, resume=MAY_CHANGE)
    image_size: int = option(None, INT, "imagefolder: resize to N x N (default 32)", optional=True, range=POSITIVE)
    channels: int = option(None, CHOICE, "imagefolder: 1 (gray) or 3 (RGB, default)", optional=True,
                           choices=(1, 3))
    epochs: int = option(30, INT, "epochs to train (on --resume: extend or shorten the run)", range=POSITIVE,
                         resume=MAY_CHANGE)
    batch_size: int = option(100, INT, "images per training step and per test batch", range=POSITIVE)
    lr: float = option(1e-3, REAL, "Adam's learning rate, {range}", range=Range(0, 1, low_open=True))
    lr_decay: float = option(0.9, REAL, "ExponentialLR gamma {range}, applied after each epoch",
                             range=Range(0, 1, low_open=True))
    reconstruction_weight: float = option(DEFAULT_RECONSTRUCTION_WEIGHT, REAL,
                                          "the reconstruction term's weight in the loss",
                                          range=Range(0, MAX_LOSS_WEIGHT), capsnet_only=True)
    augment: str = option("default", CHOICE, "default: the dataset's (shift for MNIST-like data and image "
                                               "folders; none for smallnorb and cifar10, whose random crops are "
                                               "their augmentation)", choices=AUGMENTATIONS)
    seed: int = option(0, INT, "the seed of the initialisation, the shuffling and the augmentation",
                       range=Range(0, MAX_SEED, high_text="2**63 - 1"), study=False)
    dtype: str = option("float32", CHOICE, "the dtype of the weights and activations",
                        choices=("float32", "float64"))
    device: str = option("auto", TEXT, "auto (the GPU where there is one), cpu, cuda or cuda:N", resume=MAY_CHANGE)
    cuda_graph: str = option("auto", CHOICE, "capture the training step as a CUDA graph and replay it (GPU only; "
                                               "auto: where the step allows it, saying why not otherwise; on: fail "
                                               "where it cannot; the last, smaller batch of an epoch and logged "
                                               "gradflow steps run eagerly)", choices=CUDA_GRAPH_MODES,
                             resume=MAY_CHANGE)
    matmul_precision: str = option("highest", CHOICE, "GPU matrix products and convolutions in float32 (highest) "
                                                        "or TF32 tensor cores (high, PyTorch's default for cuDNN "
                                                        "convolutions); the CPU always computes in float32",
                                   choices=PRECISIONS)
    threads: int = option(None, INT, "engine and BLAS threads of the run (default: $TINYGRAD_CAPS_NUM_THREADS, "
                                       "else BLAS's own: $OPENBLAS_NUM_THREADS, $OMP_NUM_THREADS or the CPUs); "
                                       "recorded in config.json and restored by --resume, since BLAS's sums round "
                                       "by their thread count", optional=True,
                          range=Range(1, MAX_THREADS), resume=RESTORED, study=False, metavar="N")
    limit_train: int = option(None, INT, "the first N training images only", optional=True, range=POSITIVE)
    limit_test: int = option(None, INT, "the first N test images only", optional=True, range=POSITIVE)
    log_gradflow: int = option(None, INT, "every N batches, append that batch's routing statistics and "
                                            "per-iteration gradient norms to RUN/gradflow.jsonl", optional=True,
                               range=POSITIVE, resume=MAY_CHANGE, capsnet_only=True, metavar="N")
    log_mode_cosine: bool = option(False, BOOL, "with --log-gradflow: also the cosine between the logged step's "
                                                  "gradient and the other routing-gradient mode's (full or detach) "
                                                  "on the same batch and weights (one more forward and backward per "
                                                  "logged step; one process only)", resume=MAY_CHANGE,
                                   capsnet_only=True)
    tensorboard: str = option(None, TEXT, "also write TensorBoard event files (default folder RUN/tensorboard; "
                                            "needs tensorboardX: pip install -e '.[tensorboard]'): losses, accuracy, "
                                            "rate and images/s per logging interval, each epoch's metrics and "
                                            "reconstructions, and with --log-gradflow the routing figures and "
                                            "histograms of the couplings and gradients", optional=True, empty=True,
                              resume=MAY_CHANGE, study=False, metavar="DIR")
    preset: str = option(None, CHOICE, "sabour-official: the official code's conventions and training options; "
                                         "cifar10: Sabour et al.'s CIFAR-10 changes (64 primary capsule types, "
                                         "none-of-the-above); explicit options win", optional=True,
                         choices=PRESET_NAMES, study=False)
    distributed: bool = option(False, BOOL, "data-parallel training over the processes that mpirun started "
                                              "(--batch-size is the global batch; rank 0 writes the files)",
                               resume=LAUNCH, study=False)
    sync_batchnorm: bool = option(False, BOOL, "with --distributed: batch-norm statistics over the global batch "
                                                 "(default: per process)", resume=LAUNCH, study=False)
    network: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "network", self._checked_network(self.network))

    def _checked_network(self, network) -> dict:
        """The model's part, each option checked against the model's config class (geometry too), then
        the options together (a recipe part that does not apply to the routing: an OptionError naming it)."""
        if not isinstance(network, dict):
            raise OptionError("TrainingConfig", "network", f"must be a dict of model options, got {shown(network)}")
        config_class = MODEL_CONFIGS[self.model]
        checked_network = {key: value if value is None else json_form(config_class.check_option(key, value))
                           for key, value in network.items()}
        config_class.from_dict({key: value for key, value in checked_network.items() if value is not None})
        return checked_network

    @functools.cached_property
    def model_config(self):
        """The model's typed config (a CapsNetConfig or BaselineCNNConfig, as ``model`` says): the
        options ``network`` sets, the others' defaults, the geometry once ``for_data`` gave it."""
        return MODEL_CONFIGS[self.model].from_dict({k: v for k, v in self.network.items() if v is not None})

    def for_data(self, spec) -> "TrainingConfig":
        """This config on the dataset ``spec`` describes: its geometry in ``network`` (and
        ``image_size``), and ``augment`` "default" resolved to the dataset's own."""
        geometry = dict(in_channels=spec.channels, image_size=spec.image_size, num_classes=spec.num_classes)
        return self.replace(image_size=spec.image_size, network=dict(self.network, **geometry),
                            augment=(spec.augment or "none") if self.augment == "default" else self.augment)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingConfig":
        """The config of a run's ``config.json`` (or ``to_dict``'s form): the training options, and the
        model options and geometry into ``network``; ``version`` is left out. ValueError naming an
        unknown key or a bad value."""
        if not isinstance(d, dict):
            raise ValueError(f"TrainingConfig: a run's config is a JSON object, got {shown(d)}")
        names = set(cls.option_keys())
        model = d.get("model") or "capsnet"
        if model not in MODEL_CONFIGS:
            raise OptionError("TrainingConfig", "model", f"must be one of {', '.join(MODEL_CONFIGS)}, got "
                                                         f"{shown(model)}")
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


def training_config(config, **changes) -> TrainingConfig:
    """``config`` (a TrainingConfig, or a run's options as a dict: config.json's form) with ``changes``
    as a TrainingConfig; a bad or unknown option is a UsageError naming its command-line option."""
    try:
        config = config if isinstance(config, TrainingConfig) else TrainingConfig.from_dict(config)
        return config.replace(**changes) if changes else config
    except OptionError as exc:
        raise UsageError(f"{option_flag(exc.field)} {exc.reason}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


MAY_CHANGE_ON_RESUME = TrainingConfig.option_keys(resume=MAY_CHANGE)
RESTORED_ON_RESUME = TrainingConfig.option_keys(resume=RESTORED)
LAUNCH_OPTIONS = TrainingConfig.option_keys(resume=LAUNCH)
CAPSULE_TRAINING_OPTIONS = TrainingConfig.option_keys(capsnet_only=True)
STUDY_OPTIONS = TrainingConfig.option_keys(study=True)
