"""What every option says about a bad value, on the command line and in Python, against the texts
recorded before CapsNetConfig, BaselineCNNConfig and TrainingConfig shared one option facility
(option_messages.json, ``tests/support/option_messages.py``). The differences are the facility's one
wording, listed rule by rule in ACCEPTED (CHANGELOG.md, "Changed: options and the Trainer"); every
other text, and every TrainingConfig text, is as it was."""
import json
import re

import pytest

from option_messages import observed
from paths import ROOT

RECORDED = json.loads((ROOT / "tests" / "app" / "option_messages.json").read_text())
# (what a recorded text said, what it says now): the deliberate changes, each a regular expression
ACCEPTED = [
    # a model option's positive integer, in Python, as the command line and TrainingConfig say it
    (r"must be an integer >= 1, got", "must be a positive integer, got"),
    # a bounded integer, in Python, as the command line says it
    (r"must be an integer in (\[\d+, \d+\]), got", r"must lie in \1, got"),
    # numbers in ranges written with :g, as TrainingConfig's are
    (r"must lie in \[1e-30, 1\.0\)", "must lie in [1e-30, 1)"),
    (r"must lie in \[0\.0, 1\.0\)", "must lie in [0, 1)"),
    # a model option's positive integer on the command line: its check's text, not argparse's
    (r"invalid positive_int value: ('[^']*')", r"must be an integer, got \1"),
    # inf on the command line: the option's check speaks (as TrainingConfig's do), not the parser
    (r"argument --em-inverse-temperature: must be finite, got inf",
     "argument --em-inverse-temperature: must be a number, one number per routing iteration, paper or recipe, "
     "got float inf"),
    (r"must be finite, got inf", "must be a finite number, got float inf"),
]


def accepted(text: str, used: set) -> str:
    for number, (pattern, replacement) in enumerate(ACCEPTED):
        changed = re.sub(pattern, replacement, text)
        if changed != text:
            used.add(number)
            text = changed
    return text


@pytest.fixture(scope="module")
def now():
    return observed()


def test_every_option_and_value_is_recorded(now):
    assert set(now) == set(RECORDED)
    fields = {key.split(" ")[0] for key in now}
    assert {"TrainingConfig.lr", "CapsNetConfig.routing", "BaselineCNNConfig.channels"} <= fields


def test_every_text_is_the_recorded_one_but_for_the_accepted_changes(now):
    used = set()
    wrong = {key: (RECORDED[key], now[key]) for key in RECORDED if accepted(RECORDED[key], used) != now[key]}
    assert not wrong, "\n".join(f"{key}:\n  was {was}\n  now {text}" for key, (was, text) in sorted(wrong.items()))
    assert used == set(range(len(ACCEPTED))), f"rules no text needs: {sorted(set(range(len(ACCEPTED))) - used)}"


def test_the_training_options_say_what_they_said(now):
    assert {key: text for key, text in now.items() if key.startswith("TrainingConfig.")} == \
        {key: text for key, text in RECORDED.items() if key.startswith("TrainingConfig.")}
