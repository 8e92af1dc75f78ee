"""save/load: nested state round-trips, atomic writes, and clear errors for bad files."""
import os
import zipfile

import numpy as np
import pytest

import tinygrad_caps as tc

from helpers import damaged_npy_header


def test_nested_state_round_trips(tmp_path):
    state = {
        "model": {"w": np.arange(6.0).reshape(2, 3), "b": tc.tensor(np.ones(3, np.float32))},
        "epoch": 3, "lr": 1e-3, "name": "caps", "flags": [True, None], "pair": (1, 2.5),
        "optimizer": {"state": {"0": {"step": 4, "exp_avg": np.zeros(2)}}},
    }
    path = tmp_path / "ckpt.npz"
    tc.save(state, path)
    loaded = tc.load(path)
    np.testing.assert_array_equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["model"]["b"].dtype == np.float32
    assert loaded["epoch"] == 3 and loaded["lr"] == 1e-3 and loaded["name"] == "caps"
    assert loaded["flags"] == [True, None] and loaded["pair"] == (1, 2.5)
    assert loaded["optimizer"]["state"]["0"]["step"] == 4
    assert [p for p in os.listdir(tmp_path)] == ["ckpt.npz"]  # no temporary left behind


def test_truncated_corrupt_and_foreign_files_raise_checkpoint_errors(tmp_path):
    path = tmp_path / "ckpt.npz"
    tc.save({"w": np.random.default_rng(0).standard_normal(1000)}, path)
    data = path.read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.npz").write_bytes(b"not a checkpoint at all")
    np.savez(tmp_path / "foreign.npz", x=np.zeros(2))
    for name in ("truncated.npz", "garbage.npz", "foreign.npz"):
        with pytest.raises(tc.CheckpointError, match=name):
            tc.load(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        tc.load(tmp_path / "missing.npz")


def test_objects_that_would_need_pickle_are_refused(tmp_path):
    with pytest.raises(TypeError, match="cannot store"):
        tc.save({"f": lambda x: x}, tmp_path / "x.npz")


def test_model_checkpoint_restores_weights(tmp_path):
    net = tc.nn.Linear(3, 2)
    tc.save(net.state_dict(), tmp_path / "net.npz")
    other = tc.nn.Linear(3, 2)
    other.load_state_dict(tc.load(tmp_path / "net.npz"))
    np.testing.assert_array_equal(other.weight.numpy(), net.weight.numpy())


def test_a_damaged_npy_header_is_a_checkpoint_error(tmp_path):
    """NumPy's header parser raises tokenize.TokenError (not a ValueError) for an unclosed brace."""
    path = tmp_path / "ckpt.npz"
    tc.save({"w": np.zeros(3, np.float32)}, path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    array_name = next(name for name in members if not name.startswith("__"))
    members[array_name] = damaged_npy_header(members[array_name])
    with zipfile.ZipFile(tmp_path / "damaged.npz", "w", zipfile.ZIP_STORED) as archive:  # with a valid CRC
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(tc.CheckpointError, match="damaged.npz.*damaged .npy header"):
        tc.load(tmp_path / "damaged.npz")
