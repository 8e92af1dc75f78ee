"""What every option of TrainingConfig, CapsNetConfig and BaselineCNNConfig says about a bad value,
on the command line (``train``'s parser) and in Python (the config's own check): the texts
tests/app/test_option_messages.py compares with those recorded before the options shared one
facility (tests/app/option_messages.json; ``python tests/support/option_messages.py > FILE`` records).
"""
import contextlib
import dataclasses
import io
import json
import math

CLI_VALUES = ("x", "-1", "0", "0.5", "1e9", "inf", "nope", "", "1,2", "3x")
PYTHON_VALUES = (-1, 0, 10 ** 9, 0.5, 1e9, math.inf, "x", "", True, None, [1], "nope")


def config_classes() -> dict:
    from tinygrad_caps.models import BaselineCNNConfig, CapsNetConfig, TrainingConfig

    return {"TrainingConfig": TrainingConfig, "CapsNetConfig": CapsNetConfig, "BaselineCNNConfig": BaselineCNNConfig}


def stored_name(config_class, field) -> str:
    """The name a field is stored and parsed under (cnn_channels for BaselineCNNConfig.channels)."""
    key = field.metadata.get("key")
    return key or field.name


def cli_text(parser, argv) -> str:
    """The one line ``parser`` prints for ``argv`` (or "ok" where it parses)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit:
        return err.getvalue().strip()
    return "ok"


def python_text(config_class, name, value) -> str:
    """What ``config_class(name=value)`` raises (its text), or "ok"."""
    try:
        config_class(**{name: value})
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def observed() -> dict:
    """{"<Config>.<field> cli '<text>'" or "<Config>.<field> python <repr>": what it says}."""
    from tinygrad_caps.models.cli import make_parser

    parser = make_parser()
    found = {}
    for config_name, config_class in config_classes().items():
        for field in dataclasses.fields(config_class):
            if field.name == "network":
                continue
            flag = "--" + stored_name(config_class, field).replace("_", "-")
            geometry = field.metadata.get("geometry") or False
            takes_value = field.type not in ("bool", bool) and not geometry
            if takes_value and not (config_name == "TrainingConfig" and field.name == "model"):
                for text in CLI_VALUES:
                    found[f"{config_name}.{field.name} cli {text!r}"] = cli_text(parser, ["train", f"{flag}={text}"])
            for value in PYTHON_VALUES:
                found[f"{config_name}.{field.name} python {value!r}"] = python_text(config_class, field.name, value)
    return found


if __name__ == "__main__":
    print(json.dumps(observed(), indent=1, sort_keys=True))
