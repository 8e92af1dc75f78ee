"""The one option facility (tinygrad_caps.models.options): a field declared once with ``option(...)``
gives its check, its command-line option, its docs-table row and the range its help states, for
CapsNetConfig, BaselineCNNConfig and TrainingConfig alike."""
import argparse
import dataclasses
import re
from dataclasses import dataclass

import pytest
from hypothesis import given, strategies as st

from tinygrad_caps.models import BaselineCNNConfig, CapsNetConfig, TrainingConfig
from tinygrad_caps.models.cli import make_parser
from tinygrad_caps.models.options import (BOOL, CHOICE, INT, POSITIVE, REAL, TEXT, Option, OptionError,
                                          OptionsConfig, Range, UnknownOptionError, add_options, argument_type,
                                          declaration, option, options_table)

CONFIGS = (CapsNetConfig, BaselineCNNConfig, TrainingConfig)
# a range written out in a help text (the declaration's "{range}" says it instead)
LITERAL_RANGE = re.compile(r"\bin [\[(]\s*-?[\d.e+-]+\s*,\s*[-\d.e+*\s]+[\])]|[<>]=?\s*-?\d")


@dataclass(frozen=True)
class Toy(OptionsConfig):
    """A config declared with the facility alone (no models module): one option of each kind."""

    TAGS = {"colour": "grey"}

    rate: float = option(0.5, REAL, "a rate, {range}", range=Range(0, 1, low_open=True))
    count: int = option(3, INT, "how many", range=POSITIVE, colour="red")
    size: int = option(None, INT, "a size {range}", range=Range(2, 8), optional=True, metavar="N")
    flavour: str = option("plain", CHOICE, "which", choices=("plain", "salted"), aliases=("--taste",))
    verbose: bool = option(False, BOOL, "say more")
    name: str = option("toy", TEXT, "what it is called", key="toy_name")


@pytest.mark.parametrize("bounds, text", [
    (Range(0, 1), "in [0, 1]"), (Range(0, 1, low_open=True), "in (0, 1]"), (Range(0, 1, high_open=True), "in [0, 1)"),
    (Range(0, 1, True, True), "in (0, 1)"), (Range(1), ">= 1"), (Range(0, low_open=True), "> 0"),
    (Range(high=5), "<= 5"), (Range(high=5, high_open=True), "< 5"),
    (Range(1e-30, 1.0, high_open=True), "in [1e-30, 1)"),
    (Range(0, 2 ** 63 - 1, high_text="2**63 - 1"), "in [0, 2**63 - 1]")])
def test_a_range_says_its_ends(bounds, text):
    assert bounds.text() == text


ranges = st.builds(lambda a, b, lo, ho: Range(min(a, b), max(a, b) + 1.0, lo, ho),
                   st.floats(-100, 100), st.floats(-100, 100), st.booleans(), st.booleans())
values = st.one_of(st.floats(-150, 150), st.sampled_from([-1.0, 0.0, 1.0, 2.0]))


@given(ranges, values)
def test_a_number_passes_the_check_exactly_when_it_lies_in_the_range(bounds, value):
    declared = Option(REAL, "x", range=bounds)
    inside = (value > bounds.low if bounds.low_open else value >= bounds.low) and (
        value < bounds.high if bounds.high_open else value <= bounds.high)
    assert (value in bounds) == inside
    if inside:
        assert declared.check(value) == value
    else:
        with pytest.raises(ValueError, match=re.escape(f"must lie {bounds.text()}, got {value}")):
            declared.check(value)


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-5, 5).map(str),
                 st.sampled_from(["x", "", "1e400", "-0", "nan", "0x1"])))
def test_the_command_line_takes_exactly_what_the_check_takes_and_says_the_same(text):
    field = Toy.field_for("rate")
    try:
        number = float(text)
    except ValueError:
        expected = f"must be a number, got {text!r}"
    else:
        try:
            expected = declaration(field).check(number)
        except ValueError as exc:
            expected = str(exc)
    try:
        got = argument_type(field)(text)
    except argparse.ArgumentTypeError as exc:
        got = str(exc)
    assert got == expected  # (a NaN never passes the check: no NaN to compare)


def test_a_text_that_is_no_number_is_refused_with_the_one_wording():
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a number, got 'x'$"):
        argument_type(Toy.field_for("rate"))("x")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be an integer, got '2.5'$"):
        argument_type(Toy.field_for("count"))("2.5")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a positive integer, got 0$"):
        argument_type(Toy.field_for("count"))("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must lie in \[2, 8\], got 9$"):
        argument_type(Toy.field_for("size"))("9")


def test_one_declaration_gives_the_check_the_parser_the_table_and_the_help():
    assert Toy().to_dict() == {"rate": 0.5, "count": 3, "size": None, "flavour": "plain", "verbose": False,
                               "toy_name": "toy"}
    with pytest.raises(OptionError, match=r"^Toy: rate must lie in \(0, 1\], got 0$"):
        Toy(rate=0)
    with pytest.raises(UnknownOptionError, match="Toy: unknown option colour"):
        Toy().replace(colour=1)
    assert Toy.option_keys(colour="red") == ("count",) and declaration(Toy.field_for("rate")).tags["colour"] == "grey"
    parser = argparse.ArgumentParser(prog="toy")
    actions = {a.dest: a for a in add_options(parser, Toy)}
    assert actions["rate"].help == "a rate, in (0, 1]" and actions["size"].metavar == "N"
    assert actions["flavour"].option_strings == ["--flavour", "--taste"] and "toy_name" in actions
    args = parser.parse_args(["--rate", "0.25", "--taste", "salted", "--verbose", "--toy-name", "t"])
    assert Toy.from_dict({k: v for k, v in vars(args).items()}) == Toy(0.25, 3, None, "salted", True, "t")
    table = options_table(Toy, columns=[("colour", lambda o: o.tags["colour"])])
    assert table.splitlines()[0] == "| option | `Toy` field | default | values | colour | what it does |"
    assert "| `--rate` | `rate` | `0.5` | in (0, 1] | grey | a rate, in (0, 1] |" in table
    assert "| `--size` | `size` | unset | an integer in [2, 8], or unset | grey | a size in [2, 8] |" in table
    assert "| `--flavour`, `--taste` | `flavour` | `\"plain\"` | `plain`, `salted` | grey | which |" in table


def test_a_default_outside_its_own_declaration_is_refused():
    with pytest.raises(ValueError, match="must lie in"):
        option(2.0, REAL, "x", range=Range(0, 1))


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_no_help_states_a_range_itself(config_class):
    for field in dataclasses.fields(config_class):
        if field.name != "network":
            assert not LITERAL_RANGE.search(declaration(field).help), f"{field.name}: write {{range}} in its help"


def test_every_help_range_and_table_value_comes_from_the_declaration():
    from tinygrad_caps.models.app.cli.model_options import options_table_markdown as model_table
    from tinygrad_caps.models.app.cli.training_options import options_table_markdown as training_table

    train = next(a for a in make_parser()._subparsers._group_actions if a.dest == "command").choices["train"]
    helps = {a.dest: a.help for a in train._actions}
    tables = model_table(CapsNetConfig) + model_table(BaselineCNNConfig) + training_table()
    ranged = 0
    for config_class in CONFIGS:
        for field in config_class.option_fields():
            declared, key = declaration(field), config_class.key(field)
            if field.name != "dataset":  # (its help names the registered datasets)
                assert helps[key] == declared.help_text(), key
            row = next(line for line in tables.splitlines() if f"| `{field.name}` |" in line and
                       line.startswith(f"| `--{key.replace('_', '-')}`"))
            assert f"| {declared.values_text()} |" in row
            if declared.range is not None:
                ranged += 1
                assert declared.range.text() in declared.values_text()
                if "{range}" in declared.help:
                    assert declared.range.text() in helps[key]
    assert ranged >= 15
    assert helps["lr"] == "Adam's learning rate, in (0, 1]"
    assert helps["lr_decay"].startswith("ExponentialLR gamma in (0, 1]")
