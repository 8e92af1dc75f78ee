"""What the installed CuPy does with our modules (``RawModule(code=modules.module_source(X.cu, variant),
options=launch.NVRTC_OPTIONS)``) without a GPU, run in a process of its own with ``CUPY_CACHE_DIR``
set: RawModule compiles through
``cupy._core.core.compile_with_cache(code, options, prepend_cupy_headers=False)`` (cupy/_core/raw.pyx,
``_get_raw_module``), called here for every module in a thread pool, as ``kernels.warmup`` does, with
the device's architecture answered ("90"); loading the cubin, the last step, fails without a GPU
and is let fail; everything else, NVRTC and CuPy's on-disk cache included, is CuPy's own code.

    python cupy_cache_probe.py [EXTRA_SOURCE_LINE]

``CUPY_CACHE_PROBE_SOURCES=a.cu,b.cu`` limits it to those sources' modules (the cache test takes the
two smallest: what the cache does is the same for every module, and each compile costs seconds).

Prints one JSON line: {"compiled": [the modules NVRTC compiled, "routing.cu[f32]"...], "seconds":
wall time}. With EXTRA_SOURCE_LINE, activation.cu's modules get that line appended (a changed source; the
smallest file, to compile again quickly)."""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import cupy._core.core as core
from cupy.cuda import compiler
from cupy_backends.cuda.api.driver import CUDADriverError
from cupy_backends.cuda.api.runtime import CUDARuntimeError

from tinygrad_caps.kernels.launch import NVRTC_OPTIONS, cuda_sources
from tinygrad_caps.kernels.modules import module_label, module_source, module_variants


compiler._get_arch = lambda: "90"
compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{arch or '90'}", "cubin")
compiled = []
nvrtc = compiler._compile_using_nvrtc_no_warning
extra = sys.argv[1] if len(sys.argv) > 1 else None
chosen = [name for name in os.environ.get("CUPY_CACHE_PROBE_SOURCES", "").split(",") if name] or cuda_sources()
units = [(source, variant) for source in chosen for variant in module_variants(source)]
texts = {unit: module_source(*unit) + (f"\n{extra}\n" if extra and unit[0] == "activation.cu" else "") for unit in units}


def counting(source, *args, **kwargs):
    found = [unit for unit, text in texts.items() if text in source]  # CuPy may add to the text
    compiled.append(module_label(*max(found, key=lambda unit: len(texts[unit]))) if found else "?")
    return nvrtc(source, *args, **kwargs)


compiler._compile_using_nvrtc_no_warning = counting


def compile_one(unit):
    try:
        core.compile_with_cache(texts[unit], NVRTC_OPTIONS, None, prepend_cupy_headers=False)
    except (CUDADriverError, CUDARuntimeError):  # Module.load, CuPy's last step (after writing the cache), needs a GPU
        pass


started = time.perf_counter()
with ThreadPoolExecutor(max_workers=len(units)) as pool:
    list(pool.map(compile_one, units))
print(json.dumps({"compiled": sorted(compiled), "seconds": time.perf_counter() - started}))
