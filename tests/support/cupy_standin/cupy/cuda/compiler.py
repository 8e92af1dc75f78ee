"""``cupy.cuda.compiler`` of the CPU stand-in, with a model of CuPy's kernel cache for RawModule.

CuPy compiles a ``RawModule(code=...)`` once per process and device, and keeps the cubin in
``CUPY_CACHE_DIR`` under the SHA-1 of the source, the options and the architecture, so a later
process loads it instead of compiling. Here "compiling" sleeps ``CUPY_STANDIN_COMPILE_SECONDS``
(default 0) without the GIL, as NVRTC runs, and writes a small file under that name (holding the
module's kernel names, as a cubin's symbols do). The
stand-in writes into ``CUPY_CACHE_DIR`` only when it is set (never into your home): without it
the cache lives in the process, as with ``CUPY_CACHE_IN_MEMORY=1``. What a test reads:
``compiled`` (the cache entries compiled by this process, in order) and ``most_at_once`` (the most
compiles that ran at the same time).
"""
import hashlib
import os
import re
import tempfile
import threading
import time

CACHE_DIR = os.environ.get("CUPY_CACHE_DIR")  # read at import, as CuPy reads it
COMPILE_SECONDS = float(os.environ.get("CUPY_STANDIN_COMPILE_SECONDS", "0"))

compiled = []       # names of the cache entries this process compiled
most_at_once = 0    # the most compiles that ran at the same time
_running = 0
_loaded = set()     # (device, name): what this process compiled or loaded
_lock = threading.Lock()
_KERNEL_NAMES = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)')


class CompileException(Exception):
    def get_message(self) -> str:
        return str(self)


def compile_with_cache(code: str, options: tuple, device: int) -> None:
    """Make ``code`` (compiled with ``options``) loaded on ``device``: from this process's modules,
    else from the cache folder, else compiled (and written there)."""
    global _running, most_at_once
    # a name CuPy would never load, should CUPY_CACHE_DIR be a real cache
    name = hashlib.sha1(f"sm_90 {options} {code}".encode()).hexdigest() + ".standin.cubin"
    with _lock:
        if (device, name) in _loaded:
            return
    path = None if CACHE_DIR is None else os.path.join(CACHE_DIR, name)
    if path is None or not os.path.exists(path):
        with _lock:
            _running += 1
            most_at_once = max(most_at_once, _running)
        time.sleep(COMPILE_SECONDS)
        with _lock:
            _running -= 1
            compiled.append(name)
        if path is not None:
            os.makedirs(CACHE_DIR, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=CACHE_DIR, delete=False) as temporary:
                # a cubin holds its kernels' names (their ELF symbols): so does this file
                temporary.write(b"standin cubin\n" + "\n".join(_KERNEL_NAMES.findall(code)).encode())
            os.replace(temporary.name, path)
    with _lock:
        _loaded.add((device, name))
