"""Fixtures of the tests of the command; the plain helpers and options they use (TINY, ``train()``,
``one_line_error()``) are in tests/support/cli_helpers.py."""
import pytest

from cli_helpers import tiny_data_dir


@pytest.fixture
def data_dir(tmp_path):
    """``tmp_path/data``, holding the dataset "tiny": 40 training and 16 test images (``tiny_data_dir``).
    A file that needs another dataset defines a ``data_dir`` of its own, which takes precedence."""
    return tiny_data_dir(tmp_path / "data")
