"""``DatasetSpec.check_available``: where a dataset's files are missing (or only partly there) and may not
be downloaded, the DatasetError that loading raises, said without reading or downloading anything (a
study checks its runs so before it writes anything); where they are there, or may be downloaded,
nothing."""
import pytest

from cli_helpers import tiny_data_dir
from tinygrad_caps.data import DatasetError, cifar, dataset_spec, mnist, norb
from tinygrad_caps.data.idx import read_idx
from tinygrad_caps.data.registry import DatasetSpec

KNOWN = ("mnist", "fashion-mnist", "cifar10", "smallnorb")


@pytest.fixture(autouse=True)
def nothing_elsewhere(tmp_path, monkeypatch):
    """No cache and no system folder holds a dataset; nothing can be downloaded or read."""
    monkeypatch.setenv("TINYGRAD_CAPS_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("TINYGRAD_CAPS_OFFLINE", "1")
    for info in mnist.KNOWN.values():
        monkeypatch.setitem(info, "system_dirs", [])

    def refuse(*args, **kwargs):
        raise AssertionError("downloaded or read")

    for module, names in ((mnist, ("download", "read_idx")), (cifar, ("download_cifar10", "read_cifar_archive")),
                          (norb, ("download_smallnorb", "read_norb_matrix"))):
        for name in names:
            monkeypatch.setattr(module, name, refuse)
    return refuse


def load_error(spec, split, data_dir, download_missing=None):
    with pytest.raises(DatasetError) as refused:
        spec.loader(split, data_dir, download_missing)
    return str(refused.value)


@pytest.mark.parametrize("name", KNOWN)
def test_a_missing_known_dataset_is_refused_as_loading_refuses_it(tmp_path, name):
    data_dir = tmp_path / "empty"
    data_dir.mkdir()
    spec = dataset_spec(name, data_dir)
    with pytest.raises(DatasetError) as checked:
        spec.check_available(data_dir)
    assert str(checked.value) == load_error(spec, "train", data_dir)
    assert "not found (downloads are off)" in str(checked.value)


@pytest.mark.parametrize("name", KNOWN)
def test_a_missing_known_dataset_that_may_be_downloaded_passes_without_a_download(tmp_path, name):
    spec = dataset_spec(name, tmp_path)
    spec.check_available(tmp_path, download_missing=True)  # (the run downloads it; the fixture refuses here)


PARTS = {"mnist": ["train-images-idx3-ubyte"], "fashion-mnist": ["t10k-labels-idx1-ubyte.gz"],
         "cifar10": ["test_batch.bin"], "smallnorb": ["smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat"]}


@pytest.mark.parametrize("name", KNOWN)
def test_a_folder_with_part_of_a_dataset_is_refused_as_loading_refuses_it(tmp_path, name):
    for stem in PARTS[name]:
        (tmp_path / stem).write_bytes(b"")
    spec = dataset_spec(name, tmp_path)
    with pytest.raises(DatasetError, match="holds only part of dataset") as checked:
        spec.check_available(tmp_path)
    assert str(checked.value) == load_error(spec, "train", tmp_path)


WHOLE = {"mnist": mnist.ALL_FILES, "fashion-mnist": mnist.ALL_FILES,
         "cifar10": cifar.SPLIT_MEMBERS["train"] + cifar.SPLIT_MEMBERS["test"],
         "smallnorb": [f"{prefix}-{kind}.mat" for prefix in norb.SPLIT_PREFIX.values() for kind in ("dat", "cat")]}


@pytest.mark.parametrize("name", KNOWN)
def test_a_dataset_whose_files_are_there_passes_without_a_file_read(tmp_path, name):
    for stem in WHOLE[name]:
        (tmp_path / stem).write_bytes(b"")  # (empty: reading one would fail)
    dataset_spec(name, tmp_path).check_available(tmp_path)


def test_an_idx_folder_is_checked_by_its_spec_and_passes(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist, "read_idx", read_idx)  # (its spec reads the labels, for the classes)
    data_dir = tiny_data_dir(tmp_path / "data", (8, 4), compress=False)
    dataset_spec("tiny", data_dir).check_available(data_dir)
    with pytest.raises(DatasetError, match="dataset 'tiny' not found"):
        dataset_spec("tiny", tmp_path / "elsewhere")


def test_an_image_folder_without_its_test_split_is_refused_as_loading_refuses_it(tmp_path):
    for label in ("a", "b"):
        (tmp_path / "train" / label).mkdir(parents=True)
    spec = dataset_spec("imagefolder", tmp_path)
    with pytest.raises(DatasetError, match="has no 'test' split") as checked:
        spec.check_available(tmp_path)
    assert str(checked.value) == load_error(spec, "test", tmp_path)
    (tmp_path / "test").mkdir()
    spec.check_available(tmp_path)


def test_a_spec_without_a_check_passes():
    spec = DatasetSpec("mine", ("a", "b"), 1, 4, None, None, None, lambda split, d, dl: None)
    spec.check_available("anywhere")
