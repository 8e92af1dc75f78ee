"""benchmarks/_isolated.py: a variant that crashes its process costs its own cells, with the reason,
and the cells after it are probed anew; a child past its time limit is stopped with its group."""
import sys
import time

import pytest

from paths import ROOT


@pytest.fixture
def isolated(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import _isolated

    return _isolated


CHILD = r"""
import json, os, sys
for precision, batch in [c.split(":") for c in sys.argv[2].split(",")]:
    if f"{sys.argv[1]}@{batch}" in os.environ.get("CRASH", ""):
        print("RuntimeError: CUDA error: device-side assert triggered", file=sys.stderr, flush=True)
        os.abort()
    print(json.dumps({"cell": [precision, int(batch)], "ok": True}), flush=True)
"""


def command_for(variant, cells):
    return [sys.executable, "-c", CHILD, variant, ",".join(f"{p}:{b}" for p, b in cells)]


CELLS = [("highest", 32), ("highest", 100), ("high", 32), ("high", 100)]


def test_a_crash_costs_the_cell_it_happened_in_and_the_others_still_run(isolated, monkeypatch):
    monkeypatch.setenv("CRASH", "torch-graph@32")
    outcome = isolated.probe("torch-graph", CELLS, command_for, timeout=30)
    assert outcome[("highest", 100)] is None and outcome[("high", 100)] is None
    for cell in (("highest", 32), ("high", 32)):  # the second crash needed a process of its own too
        assert outcome[cell].startswith("its first steps crashed (SIGABRT) in a process of its own: RuntimeError: "
                                        "CUDA error: device-side assert triggered"), outcome[cell]
    assert isolated.probe("ours-eager", CELLS, command_for, timeout=30) == {cell: None for cell in CELLS}


def test_a_child_past_its_limit_is_stopped_and_says_so(isolated):
    started = time.perf_counter()
    result = isolated.run_child([sys.executable, "-c", "import time; print('{\"a\": 1}', flush=True); time.sleep(60)"],
                                timeout=2)
    assert result.exit is None and result.lines == [{"a": 1}] and time.perf_counter() - started < 30
    assert isolated.failure_reason(result, "its compile").startswith("its compile was stopped at its ")


def test_a_failing_child_names_its_last_error(isolated):
    result = isolated.run_child([sys.executable, "-c", "raise ValueError('bad batch')"], timeout=30)
    assert isolated.failure_reason(result) == "it failed (exit 1) in a process of its own: ValueError: bad batch"
