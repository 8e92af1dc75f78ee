"""The option names the docs quote are the commands' own: every ``tinygrad-caps COMMAND ...`` line of
a code block and every inline command (```train --resume```) names only options of that command's
parser; the options tables of docs/training.md and docs/studies.md list options of the command they
document, and every option of ``study run`` is in docs/studies.md; each page's list of the options
that may change on ``--resume`` is the command's own (``may_change_on_resume``)."""
import re
import shlex
from pathlib import Path

import pytest

from tinygrad_caps.models.app.cli import study as study_command, train as train_command
from tinygrad_caps.models.app.cli.parser import command_parsers, make_parser
from tinygrad_caps.models.app.cli.training_options import may_change_on_resume

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"\btinygrad-caps\s+(?:--debug\s+)?(?P<name>[a-z]+)(?![:\w-])")
INLINE_COMMAND = re.compile(r"^(?:tinygrad-caps\s+)?(?:--debug\s+)?(?P<name>train|evaluate|visualize|gradflow|graph|plot|"
                            r"study)(?:\s|$)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHELL_ENDS = re.compile(r"\s(?:;|\||&&|\|\||#)\s|;\s|\)\s*$|\);")
# Tables documenting one command's options: (page, the heading of their section) -> the command
OPTION_TABLES = {("training.md", "The options of `train`"): "train",
                 ("studies.md", "The command"): "study run",
                 ("studies.md", "Many runs at once"): "study run",
                 ("studies.md", "On a cluster"): "study run",
                 ("studies.md", "Squash and initialisation as model options"): "train"}
RESUME_LISTS = {"training.md": "train", "studies.md": "study run"}


def parsers() -> dict:
    """{"train": parser, "study run": parser, ...}: every command's and subcommand's parser."""
    return {parser.prog.removeprefix("tinygrad-caps "): parser for parser in command_parsers(make_parser())}


def flags_of(parser) -> set:
    return {flag for action in parser._actions for flag in action.option_strings}


def code_blocks(text: str):
    """The lines of the fenced code blocks of a page (continued lines joined)."""
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        yield from block.replace("\\\n", " ").splitlines()


def inline_spans(text: str):
    """The inline code spans of a page outside its code blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.findall(r"`([^`\n]+)`", prose)


def command_and_words(text: str, start: int, commands: dict):
    """(the command named at ``text[start:]``, the words that follow it up to a shell separator)."""
    rest = SHELL_ENDS.split(text[start:], maxsplit=1)[0]
    try:
        words = shlex.split(rest, comments=False)
    except ValueError:  # an unbalanced quote in a sample: its words as written
        words = rest.split()
    words = [w for w in words if w != "--debug"][1:]  # (after "tinygrad-caps")
    if not words:
        return None, []
    name = words[0]
    if name == "study" and len(words) > 1 and f"study {words[1]}" in commands:
        return f"study {words[1]}", words[2:]
    return name, words[1:]


def quoted_commands(page: Path, commands: dict):
    """(command, flag, where) for every option a command line of ``page`` gives its command."""
    text = page.read_text()
    for line in code_blocks(text):
        for found in COMMAND.finditer(line):
            name, words = command_and_words(line, found.start(), commands)
            yield name, [FLAG.match(w)[0] for w in words if FLAG.match(w)], line.strip()
    for span in inline_spans(text):
        found = INLINE_COMMAND.match(span)
        if found:
            line = span if span.startswith("tinygrad-caps") else f"tinygrad-caps {span}"
            name, words = command_and_words(line, 0, commands)
            yield name, [FLAG.match(w)[0] for w in words if FLAG.match(w)], span


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_line_of_the_docs_names_options_of_its_command(page):
    commands = parsers()
    problems = []
    for name, flags, where in quoted_commands(page, commands):
        if name not in commands:
            if name == "study":  # "study run ..." abbreviated as "study ..." does not occur; a bare "study" names no options
                if flags:
                    problems.append(f"{where!r}: `study` without run, summary or list")
                continue
            problems.append(f"{where!r}: no command {name!r}")
            continue
        known = flags_of(commands[name])
        problems += [f"{where!r}: {name} has no option {flag}" for flag in flags if flag not in known]
    assert not problems, "\n".join(problems)


def section_tables(text: str, heading: str) -> list:
    """The table rows of the section under ``## heading`` (or ###), up to the next heading of its level."""
    found = re.search(rf"^(#+) {re.escape(heading)}\n(.*?)(?=^\1 |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert found, f"no section {heading!r}"
    return [line for line in found[2].splitlines() if line.startswith("| ") and not line.startswith("| ---")]


@pytest.mark.parametrize("page, heading", list(OPTION_TABLES), ids=lambda x: str(x))
def test_the_options_tables_list_options_of_the_command_they_document(page, heading):
    command = OPTION_TABLES[(page, heading)]
    known = flags_of(parsers()[command])
    rows = section_tables((ROOT / "docs" / page).read_text(), heading)
    listed = [flag for row in rows for flag in FLAG.findall(row.split(" | ")[0])]
    assert listed, f"no option in the tables of {heading!r}"
    assert [flag for flag in listed if flag not in known] == []


def test_every_option_of_study_run_that_train_lacks_is_in_docs_studies():
    # (the training and model options it shares with train are train's, documented with train)
    commands = parsers()
    own = flags_of(commands["study run"]) - flags_of(commands["train"])
    text = (ROOT / "docs" / "studies.md").read_text()
    assert sorted(flag for flag in own if flag.startswith("--") and f"`{flag}" not in text) == []


@pytest.mark.parametrize("page", list(RESUME_LISTS))
def test_each_page_s_list_of_what_may_change_on_resume_is_its_command_s(page):
    text = (ROOT / "docs" / page).read_text()
    marker = "These may change on resume: "
    assert text.count(marker) == 1, f"docs/{page} has no (or two) '{marker}' lists"
    listed = re.split(r"\s\(", text.split(marker, 1)[1], maxsplit=1)[0]
    flags = [FLAG.match(span)[0] for span in re.findall(r"`([^`]+)`", listed)]
    parser = train_command.own_parser() if RESUME_LISTS[page] == "train" else study_command.run_parser()
    assert flags == may_change_on_resume(parser)


def test_the_checks_see_the_command_lines_of_the_docs():
    commands = parsers()
    seen = {name for page in PAGES for name, _, _ in quoted_commands(page, commands)}
    assert {"train", "evaluate", "visualize", "gradflow", "graph", "plot", "study run", "study summary",
            "study list"} <= seen


def test_docs_training_s_quick_run_times_agree_with_its_sample_lines():
    import json

    text = (ROOT / "docs" / "training.md").read_text()
    epochs = re.search(r"(\d+), (\d+) and (\d+) s of training in its three epochs", text)
    printed = re.search(r"^epoch 2: train loss [\d.]+ acc [\d.]+ \| test loss [\d.]+ acc ([\d.]+) \| (\d+)s$", text,
                        flags=re.MULTILINE)
    logged = json.loads(re.search(r'^\s*(\{"epoch": 2, .*\})$', text, flags=re.MULTILINE)[1])
    assert epochs and printed, "docs/training.md: the quick run's epoch times or its sample epoch line are missing"
    assert int(epochs[2]) == int(printed[2]) == round(logged["seconds"])
    assert float(printed[1]) == logged["test_accuracy"]
    bar = re.search(r"^epoch 2/3: .*\[(\d+):(\d+)<(\d+):(\d+), ([\d.]+)img/s", text, flags=re.MULTILINE)
    elapsed, left = 60 * int(bar[1]) + int(bar[2]), 60 * int(bar[3]) + int(bar[4])
    assert abs(elapsed + left - logged["seconds"]) <= 2 and abs(6000 / float(bar[5]) - logged["seconds"]) <= 2
