"""The registered studies: each a name, the configurations it compares (the training options each
sets), the options every one of its runs gets, its default budget and the gradient-flow figures its
summary reports. ``study list`` prints them, ``study run NAME`` trains them (``studies.runner``).

A study is declarative: a configuration is a ``config_id`` and a dict of training options (the
destinations of ``train``'s options, e.g. ``{"routing_iterations": 1, "reconstruction_weight": 0.0}``
or ``{"model": "cnn"}``); whatever a configuration does not set comes from the ``study run``
command line (data, model sizes, device, ...). Add your own from Python::

    from tinygrad_caps.models.app.studies.registry import register_study
    register_study("decoders", {"fc": {"decoder": "fc"}, "deconv": {"decoder": "deconv"}},
                   varies="the reconstruction decoder", epochs=3)
    # then: tinygrad_caps.models.cli.main(["study", "run", "decoders", "--out", "runs/decoders"])

``configs`` may also be a function of the study's parameters (``parameters``, e.g. the depth
study's ``max_depth``, set by ``study run --max-depth``) returning that dict.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from tinygrad_caps.kernels.moved import renamed

from ...analysis.figures import study_figure_names
from ...capsnet.config import CNN_OPTIONS, MODEL_OPTIONS, CapsNetConfig
from ...capsnet.routing import routing_recipe
from ..training.config import STUDY_OPTIONS

# The training options a configuration may set (TrainingConfig's fields marked study), beside the model options.
TRAINING_OPTIONS = STUDY_OPTIONS
CONFIG_OPTIONS = TRAINING_OPTIONS + MODEL_OPTIONS + CNN_OPTIONS
_CONFIG_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Study:
    """One registered study (see the module docstring); ``configurations(**parameters)`` gives its
    ``{config_id: options}`` for the given parameters (the study's ``parameters`` fill the rest)."""

    name: str
    configs: object                      # {config_id: options} or a function of the parameters returning one
    varies: str                          # one line: what it varies
    epochs: int = 5
    seeds: int = 3
    options: dict = field(default_factory=dict)   # set in every run (the command line may change them)
    figures: tuple = ()                  # study_figure_names() its summary reports (its runs log --log-gradflow)
    parameters: dict = field(default_factory=dict)  # name -> default, e.g. {"max_depth": 3}
    description: str = ""

    def configurations(self, **parameters) -> dict:
        """{config_id: options} of this study, checked (ValueError naming a bad id or option)."""
        values = dict(self.parameters)
        unknown = sorted(set(parameters) - set(values))
        if unknown:
            raise ValueError(f"study {self.name} takes no parameter {', '.join(unknown)}")
        values.update({k: v for k, v in parameters.items() if v is not None})
        configs = self.configs(**values) if callable(self.configs) else self.configs
        return check_configurations(self.name, configs)

    def budget(self) -> str:
        """The default budget as ``study list`` shows it."""
        return f"{self.epochs} epoch{'s' * (self.epochs != 1)} x {self.seeds} seed{'s' * (self.seeds != 1)}"


def check_configurations(name: str, configs) -> dict:
    """``configs`` as an ordered {config_id: options} dict, every id usable as a folder name and every
    option a training option (model options checked against CapsNetConfig); ValueError otherwise."""
    if not isinstance(configs, dict) or not configs:
        raise ValueError(f"study {name}: configs must be a non-empty dict {{config_id: options}}")
    checked = {}
    for config_id, options in configs.items():
        if not isinstance(config_id, str) or not _CONFIG_ID.match(config_id):
            raise ValueError(f"study {name}: config id {config_id!r} must be letters, digits, '.', '_' or '-' "
                             "(at most 64), starting with a letter or digit")
        if not isinstance(options, dict):
            raise ValueError(f"study {name}: configuration {config_id} must be a dict of training options")
        for key, value in options.items():
            if key not in CONFIG_OPTIONS:
                raise ValueError(f"study {name}: configuration {config_id} sets {key!r}, which is not a training "
                                 "option (the destinations of train's options, e.g. routing_iterations)")
            if key in MODEL_OPTIONS:
                CapsNetConfig.check_option(key, value)
        checked[config_id] = dict(options)
    return checked


STUDIES: dict = {}


def register_study(name: str, configs, *, varies: str, epochs: int = 5, seeds: int = 3, options: dict | None = None,
                   figures: tuple = (), parameters: dict | None = None, description: str = "",
                   replace: bool = False) -> Study:
    """Register (and return) a study: ``configs`` {config_id: training options} or a function of
    ``parameters`` returning that; ``varies`` one line for ``study list``; ``epochs`` and ``seeds`` its
    default budget; ``options`` set in every run; ``figures`` the gradient-flow figures
    (``analysis.figures.study_figure_names()``) its summary reports, for which its runs log
    ``--log-gradflow``. A name already registered is refused unless ``replace``."""
    if not isinstance(name, str) or not _CONFIG_ID.match(name):
        raise ValueError(f"register_study: {name!r} is not a usable study name (letters, digits, '.', '_', '-')")
    if name in STUDIES and not replace:
        raise ValueError(f"register_study: a study named {name} is registered already (replace=True to replace it)")
    known = study_figure_names()
    unknown = [f for f in figures if f not in known]
    if unknown:
        raise ValueError(f"register_study: unknown figure {unknown[0]!r}; choose from {', '.join(known)}")
    options = dict(options or {})
    if figures and not options.get("log_gradflow"):
        raise ValueError("register_study: gradient-flow figures need options={'log_gradflow': N}")
    check_configurations(name, {"options": options})
    study = Study(name, configs, varies, int(epochs), int(seeds), options, tuple(figures), dict(parameters or {}),
                  description)
    study.configurations()  # checked now, not at the first run
    STUDIES[name] = study
    return study


def get_study(name: str) -> Study:
    """The registered study ``name``; KeyError naming the registered ones otherwise."""
    if name not in STUDIES:
        raise KeyError(f"no study named {name!r}; registered: {', '.join(STUDIES)}")
    return STUDIES[name]


# --- the built-in studies ---

NO_RECONSTRUCTION = {"reconstruction_weight": 0.0}

register_study(
    "routing-ablation",
    {"baseline-cnn": {"model": "cnn"},
     "routing1-no-reconstruction": {"routing_iterations": 1, **NO_RECONSTRUCTION},
     "routing1-reconstruction": {"routing_iterations": 1},
     "routing3-no-reconstruction": {"routing_iterations": 3, **NO_RECONSTRUCTION},
     "routing3-reconstruction": {"routing_iterations": 3}},
    varies="Sabour et al. 2017 Table 1: baseline CNN; 1 and 3 routing iterations, without and with reconstruction",
    description="The CNN takes only the data and training options (its sizes are --cnn-channels, --cnn-hidden).")

register_study(
    "gradient-modes",
    {"routing1": {"routing_iterations": 1, "routing_gradient": "full"},
     "routing3-full": {"routing_iterations": 3, "routing_gradient": "full"},
     "routing3-detach": {"routing_iterations": 3, "routing_gradient": "detach"}},
    varies="routing gradient full vs detach at 3 iterations, and 1 iteration (where the two are the same computation)",
    options={"log_gradflow": 50, "log_mode_cosine": True},
    figures=("inner_share", "mode_cosine", "t_score", "digit_d_score"),
    description="At 1 iteration there is no inner iteration to detach: full and detach are one computation, run once.")

# Peer et al.'s settings, as their code has them (peerdavid/capsnet-limitations): train.py's defaults
# (reconstruction weight 1e-5), capsule/capsule_layer.py (2 routing iterations, weights N(0, 0.2),
# bias 0.1) and capsule/utils.py (their squash, eps 1e-8).
PEER_SETTINGS = {"squash": "peer", "capsule_init": "peer", "routing_iterations": 2, "reconstruction_weight": 1e-5}
HIDDEN_LAYER = [32, 12]  # Peer et al.'s hidden capsule layers: 32 capsules of 12 values
MAX_DEPTH = 16  # the depth study's deepest stack (--max-depth): 4 configurations per depth


def depth_configurations(max_depth: int = 3) -> dict:
    """0 to ``max_depth`` hidden (32, 12) capsule layers, without and with capsule bias, with our
    initialisation and squash ("ours") and with Peer et al.'s settings ("peer"); ValueError for a
    ``max_depth`` that is not an integer in [0, MAX_DEPTH]."""
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 0 <= max_depth <= MAX_DEPTH:
        raise ValueError(f"study depth: max_depth must be an integer in [0, {MAX_DEPTH}], got {max_depth!r}")
    configs = {}
    for variant in ("ours", "peer"):
        for depth in range(max_depth + 1):
            for bias in (False, True):
                options = {"hidden_capsules": [list(HIDDEN_LAYER)] * depth, "capsule_bias": bias}
                if variant == "peer":
                    options.update(PEER_SETTINGS)
                configs[f"{variant}-depth{depth}-{'bias' if bias else 'nobias'}"] = options
    return configs


register_study(
    "depth", depth_configurations,
    varies="0 to K hidden capsule layers (--max-depth), without and with capsule bias, our settings vs Peer et al.'s",
    options={"log_gradflow": 100},
    figures=("t_score", "d_score", "digit_d_score", "lowest_grad_norm"),
    parameters={"max_depth": 3},
    description="peer rows: Peer et al.'s squash, initialisation (N(0, 0.2), bias 0.1), 2 routing iterations and "
                "reconstruction weight 1e-5; their learning rate (1e-4) and batch (128) are not taken.")

register_study(
    "conventions",
    {f"{conventions}-{gradient}": {"conventions": conventions, "routing_gradient": gradient}
     for conventions in ("paper", "official") for gradient in ("full", "detach")},
    varies="the paper's equations vs the official code's conventions, with the full and the detached routing gradient")

# Every registered routing algorithm on the same model, data and seeds: the iterative ones in both
# gradient modes, the one-step ones in "full" (they have no "detach"); each under the common recipe
# and, where its authors train it otherwise, under theirs ("-authors": --recipe authors). Dynamic
# routing's authors' recipe is the common one, and uniform coupling has none.
ROUTING_ALGORITHMS = {"dynamic-full": {"routing": "dynamic", "routing_gradient": "full"},
                      "dynamic-detach": {"routing": "dynamic", "routing_gradient": "detach"},
                      "uniform": {"routing": "uniform"},
                      "em-full": {"routing": "em", "routing_gradient": "full"},
                      "em-detach": {"routing": "em", "routing_gradient": "detach"},
                      "self-attention": {"routing": "self-attention"},
                      "self-routing": {"routing": "self-routing"},
                      "em-full-authors": {"routing": "em", "routing_gradient": "full", "recipe": "authors"},
                      "em-detach-authors": {"routing": "em", "routing_gradient": "detach", "recipe": "authors"},
                      "self-attention-authors": {"routing": "self-attention", "recipe": "authors"},
                      "self-routing-authors": {"routing": "self-routing", "recipe": "authors"}}

register_study(
    "routing-algorithms", ROUTING_ALGORITHMS,
    varies="dynamic, uniform, EM, self-attention and self-routing; full vs detach where the routing is iterative",
    options={"log_gradflow": 50},
    figures=("inner_share", "t_score", "digit_d_score", "lowest_grad_norm"),
    description="Each routing's class scores are its own (capsule lengths, or EM's and self-routing's output "
                "activations); the common recipe trains every routing with the margin loss, the primary capsules' "
                "lengths as input activations and the model's squash and initialisation; the -authors "
                "configurations use the routing's authors' recipe (docs/routing.md, \"Recipes\").")

# EM routing's authors' recipe taken apart (docs/routing.md, "Recipes"): the common recipe plus one of
# the authors' parts at a time, and the whole authors' recipe, each with the full and the detached
# routing gradient. The squash is not varied: the authors' is the common one (Sabour et al.'s).
def recipe_ablation_configurations() -> dict:
    """{config_id: options}: for each gradient mode, EM routing under the common recipe ("common"), the
    common recipe with one part of the authors' ("activations", "class-loss" with its margin schedule,
    "init", "lambda"), and the authors' whole recipe ("authors"); the parts' values are the registered
    authors' recipe's."""
    authors = routing_recipe("em")
    parts = {"activations": {"input_activations": authors.input_activations},
             "class-loss": {"class_loss": authors.class_loss,
                            "spread_margin_schedule": authors.spread_margin_schedule},
             "init": {"capsule_init": authors.capsule_init},
             "lambda": {"em_inverse_temperature": authors.em_inverse_temperature}}
    configs = {}
    for gradient in ("full", "detach"):
        base = {"routing": "em", "routing_gradient": gradient}
        configs[f"em-{gradient}-common"] = dict(base)
        for part, options in parts.items():
            configs[f"em-{gradient}-{part}"] = {**base, **options}
        configs[f"em-{gradient}-authors"] = {**base, "recipe": "authors"}
    return configs


register_study(
    "recipe-ablation", recipe_ablation_configurations,
    varies="EM routing, full vs detach: the common recipe, plus one authors' part at a time (activations, class "
           "loss, initialisation, lambda schedule), and the whole authors' recipe",
    options={"log_gradflow": 50},
    figures=("inner_share", "t_score", "digit_d_score", "lowest_grad_norm"),
    description="Each part's value is EM's registered authors' recipe's (docs/routing.md, \"Recipes\"); a part "
                "credited in RESULTS.md is one whose own configuration moves the accuracy.")

# The paper's CapsNet as Sabour et al. train it (3 routing iterations, the full gradient, reconstruction
# weight 0.0005, the data set's augmentation: 2-pixel shifts on MNIST-like data), over seeds: its test
# accuracy with an interval (a GPU window trains it on the full data: benchmarks/studies/gpu_window.sh B).
register_study(
    "paper-accuracy", {"paper": {}},
    varies="nothing: the paper's CapsNet and training, its test accuracy over seeds",
    epochs=30,
    description="One configuration, the defaults of train (the paper's model and loss, --augment default: the "
                "data set's own augmentation, 2-pixel shifts for Fashion-MNIST).")

# the tuple of figure names before the figures had a registry (CHANGELOG.md): it warns, and goes in 0.2
renamed(__name__, {"GRADFLOW_FIGURES": "tinygrad_caps.models.analysis.figures.study_figure_names()"})
