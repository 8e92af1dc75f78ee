"""Old public names that still read until 0.2 (``kernels.moved.renamed``): each gives the very object
its new name does, with a DeprecationWarning matching pyproject's filter; one name each for the
device helpers the kernels and the engine share; PRECISIONS read from the engine; and every renamed
name is listed in CHANGELOG.md."""
import re
import sys
import types
from pathlib import Path

import pytest

import tinygrad_caps as tc
from paths import ROOT
from tinygrad_caps import backend
from tinygrad_caps.kernels import device, gemm, moved
from tinygrad_caps.ops import linalg

# what pyproject.toml's filterwarnings turns into an error: a test that reads an old name fails
DEPRECATION = re.compile(r".* is deprecated and will be removed in 0\.2")


def every_renamed_module():
    """Import the modules that rename names, so that ``renamed_names`` holds them all."""
    import tinygrad_caps.models.app.studies.registry  # noqa: F401


@pytest.mark.parametrize("old, new", [("device_context", "on_device_of"), ("device_name", "absolute_device_of")])
def test_an_old_kernel_name_warns_and_is_the_same_function(old, new):
    with pytest.warns(DeprecationWarning) as caught:
        function = getattr(device, old)
    assert function is getattr(device, new)
    (warning,) = caught
    assert DEPRECATION.match(str(warning.message))
    assert str(warning.message) == (f"tinygrad_caps.kernels.device.{old} is deprecated and will be removed in 0.2; "
                                    f"use tinygrad_caps.kernels.device.{new} instead")
    assert warning.filename == __file__  # it names the line that read the old name
    with pytest.warns(DeprecationWarning, match=f"device.{old} is deprecated"):
        exec(f"from tinygrad_caps.kernels.device import {old} as imported", namespace := {})
    assert namespace["imported"] is function


def test_the_engine_and_the_kernels_call_each_device_helper_by_one_name():
    assert backend.on_device_of is device.on_device_of and backend.absolute_device_of is device.absolute_device_of
    old_use = re.compile(r"\bdevice_context\b|\bdevice\.device_name\b|import [^\n]*\bdevice_name\b|^\s+device_name[,)]",
                         re.MULTILINE)
    for folder in ("kernels", "tinygrad_caps", "models", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path != Path(__file__):
                used = old_use.findall(re.sub(r"moved\.renamed\([^)]*\)", "", path.read_text()))  # (the table)
                assert not used, f"{path.relative_to(ROOT)} uses an old name: {used}"


def test_a_name_not_renamed_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'device_label'"):
        device.device_label  # noqa: B018
    assert not hasattr(device, "__path__")  # tools that walk modules ask for dunders: no warning, no value


def test_renamed_reads_a_function_value_and_a_dotted_path():
    module = types.ModuleType("renamed_example")
    module.count = lambda: (1, 2)
    sys.modules[module.__name__] = module
    try:
        moved.renamed(module.__name__, {"COUNT": "renamed_example.count()", "TOTAL": "count"})
        with pytest.warns(DeprecationWarning, match="renamed_example.COUNT is deprecated and will be removed in 0.2; "
                                                    r"use renamed_example.count\(\) instead"):
            assert module.COUNT == (1, 2)
        with pytest.warns(DeprecationWarning, match="use renamed_example.count instead"):
            assert module.TOTAL is module.count
    finally:
        del sys.modules[module.__name__]
        moved._RENAMED.pop(module.__name__)


def test_precisions_are_read_from_the_engine():
    assert linalg.PRECISIONS is gemm.PRECISIONS == ("highest", "high")
    for precision in linalg.PRECISIONS:
        tc.set_matmul_precision(precision)
        assert tc.get_matmul_precision() == precision
    tc.set_matmul_precision("highest")
    from tinygrad_caps.models.app.training.config import PRECISIONS
    assert PRECISIONS is linalg.PRECISIONS


def test_the_changelog_lists_every_renamed_name_with_its_new_one():
    every_renamed_module()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    renamed = moved.renamed_names()
    assert {"tinygrad_caps.kernels.device.device_context", "tinygrad_caps.kernels.device.device_name"} <= set(renamed)
    for old, new in renamed.items():
        assert f"| `{old}` | `{new}` |" in changelog, f"CHANGELOG.md does not list {old} -> {new}"
