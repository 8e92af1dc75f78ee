"""Each .cu compiles as one module per dtype (``tinygrad_caps.kernels.modules``): the split of every
file's kernels is exact, and the runner asks for a kernel in the module of its dtype."""
import pytest

from tinygrad_caps.kernels import modules
from tinygrad_caps.kernels.launch import cuda_sources


@pytest.mark.parametrize("source", cuda_sources())
def test_each_variant_holds_exactly_the_kernels_of_its_dtype(source):
    kernels = modules.kernel_names(source)
    assert kernels and len(set(kernels)) == len(kernels)
    variants = modules.module_variants(source)
    assert {"f32", "f64"} <= set(variants)
    held = []
    for variant in variants:
        text = modules.module_source(source, variant)
        names = modules._KERNEL.findall(text)
        # a wrapper whose body the pattern cannot see whole would stay in every variant: none does
        assert names == [k for k in kernels if modules.kernel_variant(k) == variant], (source, variant)
        held += names
    assert sorted(held) == sorted(kernels)


def test_a_kernels_variant_is_its_dtype_suffix():
    assert [modules.kernel_variant(k) for k in ("im2col_i32_f32", "adam_step_f64", "increment_counts_i32")] == [
        "f32", "f64", ""]
    assert modules.module_label("routing.cu", "f32") == "routing.cu[f32]"
