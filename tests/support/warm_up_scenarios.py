"""Kernel warm-up scenarios under the CPU stand-in for CuPy (whose RawModule compiles through a model
of CuPy's kernel cache: ``cupy_standin/cupy/cuda/compiler.py``), each in a process of its own
(support/standin.py): ``python warm_up_scenarios.py NAME``. Each prints one JSON line of what it saw;
the tests judge it."""
import json
import os
import sys

import numpy as np


def _compiles():
    import cupy

    return {"compiled": len(cupy.cuda.compiler.compiled), "distinct": len(set(cupy.cuda.compiler.compiled)),
            "most_at_once": cupy.cuda.compiler.most_at_once}


def _modules(only_loaded=False):
    """Every module (both dtypes and none: "routing.cu[f32]"...), or those loaded on GPU 0."""
    from tinygrad_caps.kernels import launch, modules

    return [modules.module_label(s, v) for s in launch.cuda_sources() for v in modules.module_variants(s)
            if not only_loaded or modules.module_loaded(s, v, 0)]


def warm_up_twice(_):
    """``warm_up`` twice on GPU 0: what each call loaded, what was compiled, the cache folder's files."""
    from tinygrad_caps.kernels import warm_up

    first, second = warm_up("cuda"), warm_up(0)
    cache = os.environ.get("CUPY_CACHE_DIR")
    print(json.dumps({"first": list(first.modules), "workers": first.workers, "second": list(second.modules),
                      "modules": _modules(), "files": sorted(os.listdir(cache)) if cache else None,
                      "module_seconds": first.module_seconds, "seconds": first.seconds, **_compiles()}))


def first_launch(_):
    """A tiny float32 CapsNet's forward pass on GPU 0 (its first kernel launches): the modules loaded then."""
    import tinygrad_caps as tc
    from tinygrad_caps.models import CapsNet

    tc.manual_seed(0)
    model = CapsNet(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=3, in_channels=1,
                    image_size=10, num_classes=3).to(device="cuda")
    model(tc.tensor(np.zeros((2, 1, 10, 10), np.float32), device="cuda"))
    print(json.dumps({"loaded": _modules(only_loaded=True), "modules": _modules(), **_compiles()}))


def no_gpu(_):
    """``warm_up`` where CuPy finds no GPU: the error it raises."""
    from tinygrad_caps.kernels import warm_up

    try:
        warm_up()
    except Exception as exc:  # noqa: BLE001  (reported for the test to judge)
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    print(json.dumps({"error": None}))


SCENARIOS = {f.__name__: f for f in (warm_up_twice, first_launch, no_gpu)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](None)
