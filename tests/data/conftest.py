"""Fixtures of the dataset tests: a dataset cache of the test's own and no network. A file takes them
with ``pytestmark = pytest.mark.usefixtures(...)``; test_fuzz_data.py takes neither (Hypothesis examples
share a test's fixtures, so it sets a cache per example with ``dataset_files.data_cache``)."""
import urllib.request

import pytest


@pytest.fixture
def private_cache(monkeypatch, tmp_path):
    """``$TINYGRAD_CAPS_DATA`` set to ``tmp_path/cache`` for the test; returns that folder."""
    monkeypatch.setenv("TINYGRAD_CAPS_DATA", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def offline_cache(monkeypatch, private_cache):
    """A ``private_cache``, and ``urllib.request.urlopen`` raising OSError: a download the test did not fake
    fails as one without a network would. Returns the cache's folder."""
    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    return private_cache
