"""The mutation tools (tests/mutation/) name test files that exist: run_mutation.py and
planted_bugs.py drop a missing file from their selections silently, so a moved or renamed test
file would quietly leave their runs."""
import importlib

from paths import ROOT, TESTS


def test_every_test_file_the_mutation_tools_select_exists(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS / "mutation"))
    run_mutation = importlib.import_module("run_mutation")
    planted_bugs = importlib.import_module("planted_bugs")
    selected = {path for paths in run_mutation.SELECTIONS.values() for path in paths}
    selected |= set(run_mutation.DEFAULT_SELECTION) | set(planted_bugs.FAST_TESTS)
    assert selected and all(path.startswith("tests/") for path in selected)
    missing = sorted(path for path in selected if not (ROOT / path).is_file())
    assert not missing, f"selected by tests/mutation/ but not in the tree: {missing}"
