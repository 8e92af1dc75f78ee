"""The test counts docs/testing.md quotes are the suite's: it collects the suite in a process of its own
(with PyTorch hidden, as the README installs the project) and compares the tests of the whole suite, of
the quick loop (``-m "not slow"``) and those that need a GPU with the figures of the page.

A count is what pytest reports for a run: passed plus skipped, where a file that cannot be imported
without PyTorch counts as one skipped test."""
import json
import re
import subprocess
import sys

import pytest

from paths import ROOT

pytestmark = pytest.mark.slow  # it collects the whole suite: about 10 s

COUNTER = r'''
import json, sys
import pytest
sys.path.insert(0, sys.argv[1])
import without_torch  # tests/mutation: ``import torch`` fails, as without PyTorch
without_torch.hide(without_torch.BLOCKED)


class Count:
    def __init__(self):
        self.counts, self.skipped_files = {}, []

    def pytest_collectreport(self, report):
        if report.skipped:
            self.skipped_files.append([report.nodeid, str(report.longrepr[-1])])

    @pytest.hookimpl(trylast=True)  # after tests/conftest.py has marked the slow tests
    def pytest_collection_modifyitems(self, items):
        self.counts = {"all": len(items), "quick": sum(not i.get_closest_marker("slow") for i in items),
                       "gpu": sum(bool(i.get_closest_marker("gpu") or i.get_closest_marker("multigpu"))
                                  for i in items)}


count = Count()
status = pytest.main(["--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", sys.argv[2]],
                     plugins=[count])
print(json.dumps(dict(count.counts, status=int(status), skipped_files=count.skipped_files)))
'''


def number(text: str) -> int:
    return int(text.replace(",", ""))


def quoted(pattern: str) -> int:
    """The count that ``pattern``'s group finds in docs/testing.md (one place only)."""
    found = re.findall(pattern, (ROOT / "docs" / "testing.md").read_text())
    assert len(found) == 1, f"docs/testing.md: {pattern!r} found {len(found)} times"
    return number(found[0])


@pytest.fixture(scope="module")
def collected():
    done = subprocess.run([sys.executable, "-c", COUNTER, str(ROOT / "tests" / "mutation"), str(ROOT / "tests")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 0, done.stdout[-3000:]
    missing = [f"{nodeid}: {reason}" for nodeid, reason in result["skipped_files"] if "torch" not in reason]
    if missing:  # such a file counts as one test: the counts differ from the README's install
        pytest.skip("the counts are those of the README's install (the dev extra); here files skip: "
                    + "; ".join(missing))
    result["files_skipped"] = len(result["skipped_files"])
    return result


def test_the_whole_suite_has_the_number_of_tests_the_page_gives(collected):
    assert quoted(r"whole suite[^()]*\(([\d,]+) tests") == collected["all"] + collected["files_skipped"]


def test_the_quick_loop_has_the_number_of_tests_the_page_gives(collected):
    assert quoted(r"quick loop[^()]*\(([\d,]+) tests") == collected["quick"] + collected["files_skipped"]


def test_the_gpu_tests_are_as_many_as_the_page_gives(collected):
    assert quoted(r"([\d,]+) of them need a GPU") == collected["gpu"]
