"""Compile every .cu to a cubin with NVRTC (and nvcc when present), failing on any diagnostic.

Needs no GPU: CuPy's low-level NVRTC bindings work once ``nvidia-cuda-nvrtc`` (13.x) is installed.
NVRTC gets the launcher's own options (``launch.NVRTC_OPTIONS``) plus the architecture and
``--device-as-default-execution-space``, which CuPy adds itself. Compiling to a cubin (not only
PTX) runs ptxas, which is what rejects, for example, too much shared memory.

    python -m tinygrad_caps.kernels.compile_check [--arch 80 90]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .launch import NVRTC_OPTIONS, SOURCE_DIR, cuda_sources, source_text

ARCHITECTURES = ("80", "90")


class CompileError(RuntimeError):
    """A .cu file failed to compile or compiled with diagnostics; the message holds the compiler's log."""


def nvrtc_bindings():
    """CuPy's low-level NVRTC module (its location moved between CuPy versions)."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError:
        from cupy.cuda import nvrtc
    return nvrtc


def compile_with_nvrtc(name: str, arch: str) -> bytes:
    """The cubin of ``kernels/<name>`` for ``sm_<arch>``; raises CompileError on errors or warnings."""
    return compile_text_with_nvrtc(source_text(name), name, arch)


def compile_text_with_nvrtc(text: str, name: str, arch: str) -> bytes:
    """The cubin of CUDA source ``text`` for ``sm_<arch>``, with the launcher's options."""
    nvrtc = nvrtc_bindings()
    program = nvrtc.createProgram(text, name, [], [])
    options = list(NVRTC_OPTIONS) + [f"--gpu-architecture=sm_{arch}", "--device-as-default-execution-space"]
    try:
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            raise CompileError(f"NVRTC failed on kernels/{name} (sm_{arch}):\n{nvrtc.getProgramLog(program)}") from exc
        log = nvrtc.getProgramLog(program).strip("\x00\n ")
        if log:
            raise CompileError(f"NVRTC diagnostics for kernels/{name} (sm_{arch}):\n{log}")
        return nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)


def nvcc_path() -> str | None:
    """The nvcc on PATH or in /usr/local/cuda/bin, if any."""
    return shutil.which("nvcc") or next((str(p) for p in Path("/usr/local").glob("cuda*/bin/nvcc")), None)


def compile_with_nvcc(name: str, arch: str, source_dir: Path = SOURCE_DIR) -> None:
    """Compile ``<source_dir>/<name>`` to a cubin with nvcc, warnings as errors; raises CompileError."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        command = [nvcc, "-std=c++17", "-cubin", f"-arch=sm_{arch}", "-Werror", "all-warnings",
                   "-o", str(Path(tmp) / "out.cubin"), str(Path(source_dir) / name)]
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or result.stderr.strip():
        raise CompileError(f"nvcc failed on kernels/{name} (sm_{arch}):\n{result.stderr}{result.stdout}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=list(ARCHITECTURES))
    args = parser.parse_args(argv)
    failed = 0
    for name in cuda_sources():
        for arch in args.arch:
            for compiler, check in (("nvrtc", compile_with_nvrtc), ("nvcc", compile_with_nvcc)):
                if compiler == "nvcc" and nvcc_path() is None:
                    continue
                try:
                    check(name, arch)
                    print(f"ok    {compiler:5} sm_{arch} {name}")
                except CompileError as exc:
                    failed += 1
                    print(f"FAIL  {compiler:5} sm_{arch} {name}\n{exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
