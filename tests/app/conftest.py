"""Fixtures of the tests of the command; the plain helpers and options they use (TINY, ``train()``,
``one_line_error()``) are in tests/support/cli_helpers.py."""
import pytest

from cli_helpers import tiny_data_dir


@pytest.fixture
def data_dir(tmp_path):
    """``tmp_path/data``, holding the dataset "tiny": 40 training and 16 test images (``tiny_data_dir``).
    A file that needs another dataset defines a ``data_dir`` of its own, which takes precedence."""
    return tiny_data_dir(tmp_path / "data")


@pytest.fixture(scope="module")
def data_options(tmp_path_factory):
    """The dataset options of the parallel and Ray studies (``study_helpers.study_data``), once per file."""
    from study_helpers import study_data

    return study_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def sequential_study(tmp_path_factory, data_options):
    """``study_helpers.study_files`` of the tiny study trained one run at a time in the driver's process
    with one engine thread (as studies always ran), once per file: the reference of every scheduling."""
    from study_helpers import study_argv, study_files
    from tinygrad_caps.models import cli

    out = tmp_path_factory.mktemp("sequential") / "study"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINYGRAD_CAPS_NUM_THREADS", "1")
        assert cli.main(study_argv(out, data_options)) == 0
    return study_files(out)
