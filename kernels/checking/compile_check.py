"""Compile every .cu to a cubin with NVRTC (and nvcc when present), failing on any diagnostic.

Needs no GPU: CuPy's low-level NVRTC bindings work once ``nvidia-cuda-nvrtc`` (13.x) is installed.
Two NVRTC passes per file and architecture:

- ``cupy``: exactly the options ``cupy.RawModule(code=..., options=launch.NVRTC_OPTIONS)`` gives
  NVRTC, read from CuPy itself (:func:`cupy_rawmodule_options`: CuPy's include folders, our
  ``--std=c++17``, ``-ftz=true``, ``-arch=sm_XX`` and ``--device-as-default-execution-space``).
- ``strict``: the same without ``--device-as-default-execution-space``, so a helper that lacks
  ``__device__`` fails here as it fails under nvcc and under RawModule(jitify=True), instead of
  compiling by accident.

Compiling to a cubin (not only PTX) runs ptxas, which is what rejects, for example, too much
shared memory.

    python -m tinygrad_caps.kernels.checking.compile_check [--arch 80 90]
"""
from __future__ import annotations

import argparse
import functools
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from ..launch import NVRTC_OPTIONS, SOURCE_DIR, cuda_sources, source_text

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


DEFAULT_EXECUTION_SPACE = "--device-as-default-execution-space"
PASSES = ("cupy", "strict")


class _Captured(Exception):
    pass


@functools.lru_cache(maxsize=None)
def cupy_rawmodule_options(arch: str, options: tuple = NVRTC_OPTIONS) -> tuple:
    """The options CuPy's ``RawModule(code=..., options=options)`` hands NVRTC for ``sm_<arch>``.

    Read from CuPy at run time, without a GPU: RawModule compiles through
    ``cupy._core.core.compile_with_cache(code, options, prepend_cupy_headers=False)``; we call
    that with CuPy's three device queries (architecture, its NVRTC flag, the cache-key
    preprocess) answered for ``arch`` and stop at the NVRTC program's ``compile(options)``,
    recording the options. Everything else is CuPy's own code path, so a CuPy upgrade that
    changes its options changes ours.
    """
    import cupy._core.core as core
    from cupy.cuda import compiler

    captured = []

    def record(self, options=(), log_stream=None):
        captured.append(tuple(options))
        raise _Captured

    answers = {"_get_arch": lambda: arch,
               "_get_arch_for_options_for_nvrtc": lambda arch_=None: (f"-arch=sm_{arch_ or arch}", "cubin"),
               "_preprocess": lambda *args, **kwargs: ""}
    saved = {name: getattr(compiler, name) for name in answers}
    saved_compile = compiler._NVRTCProgram.compile
    # a fresh source, so CuPy's kernel cache cannot answer before NVRTC is reached
    probe = f'extern "C" __global__ void options_probe_{uuid.uuid4().hex}(float* x) {{ x[0] = 1.0f; }}\n'
    try:
        for name, answer in answers.items():
            setattr(compiler, name, answer)
        compiler._NVRTCProgram.compile = record
        try:
            core.compile_with_cache(probe, tuple(options), None, prepend_cupy_headers=False)
        except _Captured:
            pass
    finally:
        for name, original in saved.items():
            setattr(compiler, name, original)
        compiler._NVRTCProgram.compile = saved_compile
    if len(captured) != 1:
        raise RuntimeError("could not read CuPy's RawModule options: its compile path has changed")
    return captured[0]


def nvrtc_options(arch: str, compile_pass: str = "cupy") -> list:
    """NVRTC options for one pass ("cupy" or "strict", see the module docstring)."""
    if compile_pass not in PASSES:
        raise ValueError(f"compile pass must be one of {PASSES}, got {compile_pass!r}")
    options = list(cupy_rawmodule_options(arch))
    if compile_pass == "strict":
        options = [o for o in options if o != DEFAULT_EXECUTION_SPACE]
    return options


def compile_with_nvrtc(name: str, arch: str, compile_pass: str = "cupy") -> bytes:
    """The cubin of ``kernels/<name>`` for ``sm_<arch>``; raises CompileError on errors or warnings."""
    return compile_text_with_nvrtc(source_text(name), name, arch, compile_pass)


def compile_text_with_nvrtc(text: str, name: str, arch: str, compile_pass: str = "cupy") -> bytes:
    """The cubin of CUDA source ``text`` for ``sm_<arch>``, with the options of ``compile_pass``."""
    cubin, diagnostics, _ = _compiled(text, name, arch, compile_pass)
    if diagnostics:
        raise CompileError(f"NVRTC ({compile_pass}) diagnostics for kernels/{name} (sm_{arch}):\n{diagnostics}")
    return cubin


# ptxas's -v report and nothing else: "ptxas info    : 0 bytes gmem", "... Compiling entry function 'k' for
# 'sm_90'", "... Function properties for k", "ptxas         .     0 bytes stack frame, ...", "... Used 32
# registers, ...", "... Compile time = 71.1 ms". Any other line (an advisory such as "ptxas info : (C7515)
# Potential Performance Loss", a warning, an error) stays a diagnostic, as it is without -v.
_PTXAS_REPORT_LINE = re.compile(
    r"^ptxas\s+(info\s*:\s*(\d+ bytes gmem|Compiling entry function|Function properties for|Used \d+ registers"
    r"|Compile time =)|\.\s+\d+ bytes stack frame)")


@functools.lru_cache(maxsize=None)
def _compiled(text: str, name: str, arch: str, compile_pass: str) -> tuple:
    """(cubin, diagnostics, ptxas's report) of one NVRTC compile, kept for the process: the compile
    check and the register count of a file read the same compile. ``--ptxas-options=-v`` only adds
    ptxas's report to the log (the code is the same); it is split off, and whatever else the log
    holds is a diagnostic. Raises CompileError when NVRTC fails."""
    nvrtc = nvrtc_bindings()
    program = nvrtc.createProgram(text, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, nvrtc_options(arch, compile_pass) + ["--ptxas-options=-v"])
        except nvrtc.NVRTCError as exc:
            raise CompileError(f"NVRTC ({compile_pass}) failed on kernels/{name} (sm_{arch}):\n"
                               f"{nvrtc.getProgramLog(program)}") from exc
        lines = nvrtc.getProgramLog(program).strip("\x00\n ").splitlines()
        report = "\n".join(line for line in lines if _PTXAS_REPORT_LINE.match(line))
        diagnostics = "\n".join(line for line in lines if line.strip() and not _PTXAS_REPORT_LINE.match(line))
        return nvrtc.getCUBIN(program), diagnostics, report
    finally:
        nvrtc.destroyProgram(program)


def register_counts(name: str, arch: str) -> dict:
    """Registers per thread of each kernel in ``kernels/<name>`` for ``sm_<arch>``, as ptxas reports
    them for CuPy's options (the compile of the ``cupy`` pass): {kernel name: registers}."""
    _, _, log = _compiled(source_text(name), name, arch, "cupy")
    # per entry function (a device function such as CUDA's __internal_accurate_pow reports no registers)
    counts = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S))
    if not counts:
        raise CompileError(f"no register counts in ptxas's report for kernels/{name} (sm_{arch}):\n{log}")
    return {kernel: int(registers) for kernel, registers in counts.items()}


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
    """Compile every .cu for each ``--arch``; returns 1 if any compile failed, else 0."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=list(ARCHITECTURES))
    args = parser.parse_args(argv)
    failed = 0
    for name in cuda_sources():
        for arch in args.arch:
            checks = [(f"nvrtc/{p}", functools.partial(compile_with_nvrtc, compile_pass=p)) for p in PASSES]
            if nvcc_path() is not None:
                checks.append(("nvcc", compile_with_nvcc))
            for compiler, check in checks:
                try:
                    check(name, arch)
                    print(f"ok    {compiler:12} sm_{arch} {name}")
                except CompileError as exc:
                    failed += 1
                    print(f"FAIL  {compiler:12} sm_{arch} {name}\n{exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
