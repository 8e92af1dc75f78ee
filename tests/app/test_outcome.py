"""How a study's run ended, said once (models/app/studies/outcome.py): the exit status of each
outcome and back, a run's result as one line of JSON (what a worker sends its driver) and the
failure a run folder records; the local executor takes a failure's reason from the result it is
sent, else from failed.json, never from a log line; and EX_TEMPFAIL's number is written in one
module of models/ only."""
import json
import re
import signal
import tokenize
from pathlib import Path

import pytest

from paths import ROOT
from tinygrad_caps.models.app.studies.folder import StudyFolder
from tinygrad_caps.models.app.studies.local_executor import LocalExecutor
from tinygrad_caps.models.app.studies.outcome import EX_TEMPFAIL, Failure, Outcome, RunResult, describe_exit
from tinygrad_caps.models.app.studies.placement import Placement
from tinygrad_caps.models.app.studies.plan import PlannedRun

RUN = PlannedRun("routing1", 3, "runs/routing1/seed-3")


@pytest.mark.parametrize("outcome, code", [(Outcome.FINISHED, 0), (Outcome.FAILED, 1), (Outcome.UNREACHABLE, 2),
                                           (Outcome.STOPPED, 75), (Outcome.INTERRUPTED, 130)])
def test_each_outcome_has_its_exit_status_and_is_found_from_it(outcome, code):
    assert outcome.exit_code == code
    assert Outcome.from_exit_code(code) is outcome


def test_sigterm_s_status_is_an_interruption_and_any_other_status_is_refused():
    assert Outcome.from_exit_code(128 + signal.SIGTERM) is Outcome.INTERRUPTED
    assert EX_TEMPFAIL == Outcome.STOPPED.exit_code
    for code in (3, 74, 76, 137, 255, -9):
        with pytest.raises(ValueError, match=f"exit status {code}" if code >= 0 else "killed by SIGKILL"):
            Outcome.from_exit_code(code)


def test_an_interrupted_result_exits_with_its_signal():
    assert RunResult(RUN, Outcome.INTERRUPTED, signum=int(signal.SIGTERM)).exit_code == 143
    assert RunResult(RUN, Outcome.INTERRUPTED).exit_code == 130
    assert RunResult(RUN, Outcome.STOPPED).exit_code == EX_TEMPFAIL


@pytest.mark.parametrize("result", [
    RunResult(RUN, Outcome.FINISHED, host="node-1"),
    RunResult(RUN, Outcome.FAILED, reason="--lr must lie in (0, 1], got 5; \"quoted\"", host="h"),
    RunResult(RUN, Outcome.FAILED, reason="its process was killed by SIGKILL", killed=True),
    RunResult(RUN, Outcome.INTERRUPTED, signum=15),
    RunResult(RUN, Outcome.UNREACHABLE, reason="node x cannot see the study folder"),
])
def test_a_result_goes_through_one_line_of_json_unchanged(result):
    line = result.to_json()
    assert "\n" not in line
    assert RunResult.from_json(line, RUN) == result
    other = PlannedRun("routing3-full", 0, "runs/routing3-full/seed-0")
    assert RunResult.from_json(line, other).run == other  # (the reader knows which run it started)


@pytest.mark.parametrize("text", ["[]", "{\"outcome\": \"exploded\"}", "not json"])
def test_a_line_that_is_no_result_is_refused(text):
    with pytest.raises(ValueError):
        RunResult.from_json(text, RUN)


def test_exits_are_described_by_their_signal_or_status():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"
    assert describe_exit(1) == "exit status 1"


def test_a_failure_is_written_to_and_read_from_the_run_folder(tmp_path):
    run = StudyFolder(tmp_path).run("routing1", 3)
    assert Failure.read(run) is None
    failure = Failure.now("config.json: Is a directory")
    failure.write(run)
    assert Failure.read(run) == failure and Failure.read(run.path) == failure
    record = json.loads(run.failed.read_text())
    assert list(record) == ["error", "host", "pid", "time"] and record["error"] == "config.json: Is a directory"
    run.failed.write_text("{\"host\": \"x\"}")  # no error line: no failure
    assert Failure.read(run) is None
    run.failed.write_text("{\"error\": \"old\"")  # damaged
    assert Failure.read(run) is None


class _Ended:
    """A worker process that has ended with ``returncode``."""

    def __init__(self, returncode):
        self.returncode = returncode


@pytest.mark.parametrize("returncode, sent, failed_json, outcome, reason", [
    (1, RunResult(RUN, Outcome.FAILED, "the reason sent").to_json(), "the recorded one", Outcome.FAILED,
     "the reason sent"),
    (1, "", "the recorded one", Outcome.FAILED, "the recorded one"),
    (1, "", None, Outcome.FAILED, "its process ended with exit status 1 before it said why"),
    (0, "", None, Outcome.FINISHED, None),
    (75, "", None, Outcome.STOPPED, None),
    (143, "", None, Outcome.INTERRUPTED, None),
    (3, "", "the recorded one", Outcome.FAILED, "its process ended with exit status 3 before it said why"),
    (-9, RunResult(RUN, Outcome.FINISHED).to_json(), None, Outcome.FAILED, "its process was killed by SIGKILL"),
])
def test_the_local_executor_takes_a_run_s_reason_from_its_result_never_from_its_log(
        tmp_path, returncode, sent, failed_json, outcome, reason):
    folder = StudyFolder(tmp_path)
    run = folder.run(RUN.config_id, RUN.seed)
    run.path.mkdir(parents=True)
    run.train_log.write_text("failed: a line of the log that must not be taken\n")
    if failed_json is not None:
        Failure.now(failed_json).write(run)
    result = LocalExecutor(folder, Placement(in_process=False))._result(RUN, returncode, (sent + "\n").encode())
    assert result.outcome is outcome and result.run == RUN
    assert (result.reason or "").startswith(reason or "")
    assert "must not be taken" not in (result.reason or "")
    assert result.killed == (returncode < 0)
    if outcome is Outcome.INTERRUPTED:
        assert result.signum == signal.SIGTERM


def _number_tokens(path: Path):
    """(line, text) of every integer literal of a Python file, and of every "75" in its strings and comments."""
    found = []
    with open(path, "rb") as f:
        for token in tokenize.tokenize(f.readline):
            if token.type == tokenize.NUMBER and token.string == str(EX_TEMPFAIL):
                found.append((token.start[0], token.string))
            elif token.type in (tokenize.STRING, tokenize.COMMENT) and re.search(r"(?<![\d.])75(?![\d.])",
                                                                                  token.string):
                found.append((token.start[0], token.string[:60]))
    return found


def test_ex_tempfail_s_number_is_written_in_outcome_py_only():
    holders = {}
    for path in sorted((ROOT / "models").rglob("*.py")):
        found = _number_tokens(path)
        if found:
            holders[str(path.relative_to(ROOT))] = found
    assert list(holders) == ["models/app/studies/outcome.py"], holders
    assert len(holders["models/app/studies/outcome.py"]) == 1  # EX_TEMPFAIL = 75


def test_the_number_check_sees_a_literal(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("EXIT = 75\nhelp = 'exit 75'\nrate = 0.75  # not it\n")
    assert [line for line, _ in _number_tokens(module)] == [1, 2]


def test_study_run_s_help_says_the_stopped_status():
    from tinygrad_caps.models.app.cli import study

    help_text = study.run_parser().format_help()
    assert f"(exit {EX_TEMPFAIL})" in " ".join(help_text.split())
