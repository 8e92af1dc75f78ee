"""Every .cu compiles to a cubin for sm_80 and sm_90 with NVRTC, given exactly the options CuPy's
RawModule passes (and once more without the default device execution space), and with nvcc, with
no diagnostics; and the check itself rejects broken sources. A file is compiled once per
architecture and pass in a process: its register counts are read from the same compile."""
import pytest

from tinygrad_caps.kernels.checking import compile_check
from tinygrad_caps.kernels.launch import cuda_sources


def nvrtc_or_skip():
    try:
        return compile_check.nvrtc_bindings()
    except ImportError:
        pytest.skip("CuPy's NVRTC bindings are not installed (pip install cupy-cuda13x nvidia-cuda-nvrtc)")


def test_every_kernel_file_is_listed():
    assert set(cuda_sources()) >= {"im2col.cu", "capsule.cu", "routing.cu"}


# CuPy's pass for every architecture; the strict pass checks execution-space annotations, which no
# architecture changes, on the newest one
NVRTC_CHECKS = [(arch, "cupy") for arch in compile_check.ARCHITECTURES] + [(compile_check.ARCHITECTURES[-1], "strict")]


@pytest.mark.parametrize("arch, compile_pass", NVRTC_CHECKS)
@pytest.mark.parametrize("name", cuda_sources())
def test_nvrtc_compiles_to_cubin_without_diagnostics(name, arch, compile_pass):
    nvrtc_or_skip()
    cubin = compile_check.compile_with_nvrtc(name, arch, compile_pass)
    assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF"


def test_options_are_cupys_own():
    nvrtc_or_skip()
    from tinygrad_caps.kernels.launch import NVRTC_OPTIONS

    options = compile_check.cupy_rawmodule_options("90")
    # ours, then what CuPy adds for every RawModule (read from CuPy, not written down here)
    assert set(NVRTC_OPTIONS) <= set(options)
    assert {"-ftz=true", "-arch=sm_90", compile_check.DEFAULT_EXECUTION_SPACE} <= set(options)
    assert any(o.startswith("-I") and o.endswith("include") for o in options)
    assert compile_check.nvrtc_options("80", "strict") == [
        o.replace("sm_90", "sm_80") for o in options if o != compile_check.DEFAULT_EXECUTION_SPACE]


HELPER_WITHOUT_DEVICE = """
float twice(float x) { return 2.0f * x; }  // missing __device__
extern "C" __global__ void k(float* x) { x[threadIdx.x] = twice(x[threadIdx.x]); }
"""


def test_a_helper_missing_device_fails_the_strict_pass():
    nvrtc_or_skip()
    # CuPy's own options make unannotated functions __device__, so RawModule would take it ...
    compile_check.compile_text_with_nvrtc(HELPER_WITHOUT_DEVICE, "helper.cu", "90", "cupy")
    # ... but nvcc and RawModule(jitify=True) would not: the strict pass rejects it
    with pytest.raises(compile_check.CompileError, match="strict"):
        compile_check.compile_text_with_nvrtc(HELPER_WITHOUT_DEVICE, "helper.cu", "90", "strict")


@pytest.mark.parametrize("name", cuda_sources())
def test_nvcc_compiles_with_warnings_as_errors(name):
    if compile_check.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    compile_check.compile_with_nvcc(name, "90")


def test_nvrtc_check_rejects_errors_warnings_and_too_much_shared_memory():
    nvrtc_or_skip()
    with pytest.raises(compile_check.CompileError, match="broken.cu"):
        compile_check.compile_text_with_nvrtc('extern "C" __global__ void k(float* x) { x[0] = y; }', "broken.cu", "90")
    with pytest.raises(compile_check.CompileError, match="diagnostics"):
        compile_check.compile_text_with_nvrtc(
            'extern "C" __global__ void k(float* x) { int unused = 3; x[0] = 1.0f; }', "warn.cu", "90")
    with pytest.raises(compile_check.CompileError):  # ptxas: 400 KB of shared memory
        compile_check.compile_text_with_nvrtc(
            'extern "C" __global__ void k(float* x) { __shared__ float big[100000]; big[threadIdx.x] = 1.0f;'
            ' __syncthreads(); x[threadIdx.x] = big[99999 - threadIdx.x]; }', "big.cu", "90")


@pytest.mark.parametrize("arch", compile_check.ARCHITECTURES)
@pytest.mark.parametrize("name", cuda_sources())
def test_every_kernel_launches_with_up_to_1024_threads_per_block(name, arch):
    """A block of 1024 threads may use at most 64 registers each (65,536 per block); a kernel over
    that fails every launch of that size with cudaErrorLaunchOutOfResources, on the GPU only."""
    nvrtc_or_skip()
    from tinygrad_caps.kernels.launch import MAX_THREADS_PER_BLOCK

    counts = compile_check.register_counts(name, arch)
    assert all(kernel.endswith(("_f32", "_f64", "_i32")) for kernel in counts)  # the dtype it takes
    over = {kernel: n for kernel, n in counts.items() if n * MAX_THREADS_PER_BLOCK > 65536}
    assert not over, f"registers per thread over 64: {over}"


def test_launcher_constants_match_the_kernel_sources():
    import re

    from tinygrad_caps.kernels import routing
    from tinygrad_caps.kernels.launch import source_text

    defined = dict(re.findall(r"#define (\w+) (\d+)", source_text("routing.cu")))
    assert int(defined["AGREEMENT_ROWS_PER_WARP"]) == routing.AGREEMENT_ROWS_PER_WARP
    assert int(defined["ROUTING_FORWARD_THREADS"]) == routing.FORWARD_THREADS
    assert "__launch_bounds__(ROUTING_FORWARD_THREADS) routing_forward_f32" in source_text("routing.cu")


def test_ptxas_report_is_split_from_the_diagnostics():
    """--ptxas-options=-v's report is not a diagnostic, but a warning beside it still is."""
    nvrtc_or_skip()
    cubin = compile_check.compile_text_with_nvrtc('extern "C" __global__ void k_f32(float* x) { x[0] = 1.0f; }',
                                                  "quiet.cu", "90")
    assert cubin[:4] == b"\x7fELF"
    with pytest.raises(compile_check.CompileError, match="diagnostics"):
        compile_check.compile_text_with_nvrtc(
            'extern "C" __global__ void k_f32(float* x) { int unused = 3; x[0] = 1.0f; }', "warn2.cu", "90")
