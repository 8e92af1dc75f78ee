"""PyTorch's whole-step CUDA graph in benchmarks/_torch_variants.py keeps alive every tensor it
replays on: the cause of the device-side assert of the H200 run of 2026-11-28 (the static labels
went back to PyTorch's allocator when ``build_graph`` returned, and the next eager step's tensors
took their block). Checked without PyTorch or a GPU, on a stand-in whose graphs record what they
touch and refuse to replay on a freed tensor (support/fake_torch_cuda.py)."""
import gc

import pytest

import fake_torch_cuda
from paths import ROOT


@pytest.fixture
def variants(monkeypatch):
    fake_torch_cuda.install(monkeypatch)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import _torch_variants

    return _torch_variants


def test_the_graph_replays_on_buffers_that_live_as_long_as_the_step(variants):
    step = variants.build_graph(fake_torch_cuda.Model(), fake_torch_cuda.Tensor(0.0, "x"),
                                fake_torch_cuda.Tensor(0.0, "y"))
    gc.collect()
    for _ in range(3):
        assert step.step().item() == 0.5
    assert set(step.buffers) == {"static_x", "static_y", "optimizer", "static_loss"}


def test_without_its_buffers_the_replay_reads_freed_memory(variants):
    """What the first build_graph did: nothing held the static inputs and the optimizer."""
    step = variants.build_graph(fake_torch_cuda.Model(), fake_torch_cuda.Tensor(0.0, "x"),
                                fake_torch_cuda.Tensor(0.0, "y"))
    step.buffers.clear()
    gc.collect()
    with pytest.raises(fake_torch_cuda.FreedDuringReplay, match="clone"):
        step.step()
