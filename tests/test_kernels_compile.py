"""Every .cu compiles to a cubin for sm_80 and sm_90 with NVRTC (the launcher's options) and nvcc,
with no diagnostics; and the check itself rejects broken sources."""
import pytest

from tinygrad_caps.kernels import compile_check
from tinygrad_caps.kernels.launch import cuda_sources


def nvrtc_or_skip():
    try:
        return compile_check.nvrtc_bindings()
    except ImportError:
        pytest.skip("CuPy's NVRTC bindings are not installed (pip install cupy-cuda13x nvidia-cuda-nvrtc)")


def test_every_kernel_file_is_listed():
    assert set(cuda_sources()) >= {"im2col.cu", "capsule.cu", "routing.cu"}


@pytest.mark.parametrize("arch", compile_check.ARCHITECTURES)
@pytest.mark.parametrize("name", cuda_sources())
def test_nvrtc_compiles_to_cubin_without_diagnostics(name, arch):
    nvrtc_or_skip()
    cubin = compile_check.compile_with_nvrtc(name, arch)
    assert len(cubin) > 1000 and cubin[:4] == b"\x7fELF"


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
