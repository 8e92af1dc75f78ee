"""The op table (tests/support/op_table.py) holds every public op of ``tinygrad_caps.functional``, and
nothing else; each entry has a NumPy reference and a gradient check, or says why not. The forward,
gradient, second-order, GPU and PyTorch tests draw their ops from it, so an op missing here would
be missing from all of them."""
import inspect
from pathlib import Path

import pytest

import tinygrad_caps.functional as F
from op_table import CHECKS, NOT_OPS, OPS

ENGINE = Path(__file__).resolve().parent
DRAWING_FROM_THE_TABLE = ["test_forward_values.py", "test_grad_elementwise.py", "test_gpu_ops.py", "test_torch_oracle.py"]


def public_names():
    """``functional.__all__``, and any public function or class defined or imported there besides."""
    names = set(F.__all__)
    names |= {name for name, value in vars(F).items()
              if not name.startswith("_") and callable(value) and not inspect.ismodule(value)}
    return names


def test_every_public_op_of_functional_is_in_the_table():
    covered = {op.function for op in OPS} | set(NOT_OPS)
    missing = sorted(public_names() - covered)
    assert not missing, (f"public in tinygrad_caps.functional but not in tests/support/op_table.py: {missing}; "
                         "add an OpInfo line to OPS (or, for a name that is not a tensor op, to NOT_OPS with the reason)")


def test_the_table_names_nothing_that_functional_lacks():
    public = public_names()
    stale = sorted({op.function for op in OPS if op.function not in public} | (set(NOT_OPS) - public))
    assert not stale, f"tests/support/op_table.py names what tinygrad_caps.functional no longer has: {stale}"
    wrong = sorted(op.name for op in OPS if getattr(F, op.function, None) is None)
    assert not wrong, wrong
    both = sorted({op.function for op in OPS} & set(NOT_OPS))
    assert not both, f"in OPS and in NOT_OPS at once: {both}"


def test_entry_names_are_unique_test_ids():
    names = [op.name for op in OPS]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    assert all(name and " " not in name for name in names)


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_each_entry_has_a_reference_and_a_gradient_check_or_says_why_not(op):
    unknown = set(op.not_tested) - set(CHECKS)
    assert not unknown, f"{op.name}: not_tested names checks that do not exist: {sorted(unknown)} (checks: {CHECKS})"
    assert all(isinstance(why, str) and why.strip() for why in op.not_tested.values()), f"{op.name}: a reason is empty"
    assert op.ref is not None or "forward" in op.not_tested, f"{op.name}: no NumPy reference and no reason why not"
    assert op.tested("grad") or op.not_tested.get("grad"), f"{op.name}: no gradient check and no reason why not"
    assert op.torch is not None or "torch" in op.not_tested, f"{op.name}: no PyTorch name and no reason why not"
    assert op.tested("gpu") or op.not_tested.get("gpu"), f"{op.name}: no GPU check and no reason why not"
    if "forward" in op.not_tested and op.ref is not None:
        assert op.tested("gpu"), f"{op.name}: a reference that no test uses (no CPU path, no GPU check)"
    assert not (op.ref is None and op.tested("forward")), op.name


def test_every_op_of_functional_gets_a_value_and_a_gradient_check_or_says_why_not():
    """Per op, over all its entries: a value checked against NumPy or PyTorch, and a gradient check."""
    unchecked = []
    for function in sorted({op.function for op in OPS}):
        entries = [op for op in OPS if op.function == function]
        if not any(op.ref is not None or op.tested("torch") or "forward" in op.not_tested for op in entries):
            unchecked.append(f"{function}: no value check")
        if not any(op.tested("grad") or op.not_tested.get("grad") for op in entries):
            unchecked.append(f"{function}: no gradient check")
    assert not unchecked, unchecked


@pytest.mark.parametrize("name", DRAWING_FROM_THE_TABLE)
def test_the_op_tests_draw_from_the_table(name):
    source = (ENGINE / name).read_text()
    assert "from op_table import" in source and "OPS" in source, f"{name} no longer parametrises from the op table"
