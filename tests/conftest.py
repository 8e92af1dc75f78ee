"""Shared test settings: Hypothesis profiles and the GPU marker.

Profiles: "default" keeps the suite to a few minutes on 2 cores; ``HYPOTHESIS_PROFILE=long`` runs
many more examples per property for a deeper local check.
"""
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=12, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
os.environ["TINYGRAD_CAPS_OFFLINE"] = "1"  # tests never touch the network (subprocesses inherit this)


def pytest_collection_modifyitems(config, items):
    from tinygrad_caps.backend import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy; none is usable here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
