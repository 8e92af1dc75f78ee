"""Scenarios that run the GPU code path under the CPU stand-in for CuPy (``tests/cupy_standin``),
started by ``test_cupy_standin.py`` in a process of their own: ``python standin_scenarios.py NAME DIR``.
Each prints "ok" at its end; any difference or error fails the process."""
import json
import sys
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.kernels import launch
from tinygrad_caps.models.routing_statistics import routing_statistics
from tinygrad_caps.models.training import batch_losses, load_checkpoint_model, train

from helpers import write_striped_dataset

TINY_MODEL = dict(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=3)


def expect(error, action, what):
    try:
        action()
    except error:
        return
    raise AssertionError(f"the stand-in let this pass: {what}")


def standin_refuses_what_cupy_refuses(_):
    """The stand-in is in use and fails where CuPy fails: otherwise the other scenarios prove nothing."""
    import cupy

    assert getattr(cupy, "STANDIN", False) and tc.gpu_available() and cupy.cuda.runtime.getDeviceCount() == 2
    a = cupy.ones(3, dtype=cupy.float32)
    expect(TypeError, lambda: np.asarray(a), "an implicit conversion to NumPy")
    expect(TypeError, lambda: a + np.ones(3, np.float32), "a NumPy operand")
    with cupy.cuda.Device(1):
        expect(ValueError, lambda: a * 2, "an array of GPU 0 used while GPU 1 is current")
        assert (cupy.asarray(a) * 2).device.id == 1  # ... after a copy it works
    kernel = cupy.RawModule(code=launch.source_text("im2col.cu")).get_function("im2col_i32_f32")
    expect(TypeError, lambda: kernel((1,), (32,), (a, a, 3)), "a Python int kernel argument")
    expect(cupy.cuda.runtime.CUDARuntimeError, lambda: cupy.RawModule(code="").get_function("im2col_i32_f32"),
           "a kernel missing from its module")
    expect(ValueError, lambda: a.__setitem__(Ellipsis, np.zeros(3, np.float32)), "a NumPy array assigned by fill")
    assert isinstance(a.sum(), cupy.ndarray)  # reductions stay on the device, as in CuPy
    print("ok")


def tensor_api_on_the_second_gpu(_):
    """Tensor methods that compute outside an op (comparisons, in-place updates, printing) on a
    tensor of GPU 1 while GPU 0 is current; factories keep "cpu" on the CPU."""
    tc.backend.use_device("cuda:0")
    assert tc.zeros(2, device="cpu").device == "cpu" and tc.tensor(np.ones(2), device="cpu").device == "cpu"
    x = tc.tensor(np.arange(6.0).reshape(2, 3), device="cuda:1", requires_grad=True)
    assert (x > 2).sum().item() == 3 and x.to("cuda:0").data.device.id == 0 and x.to("cuda").device == "cuda"
    (F.relu(x - 1.0) * 2).sum().backward()
    assert x.grad.data.device.id == 1 and x.grad.numpy().tolist() == [[0, 0, 2], [2, 2, 2]]
    x.grad = None
    x[np.array([1, 1, 0]), [0, 0, 2]].sum().backward()  # index arrays uploaded beside x; repeats accumulate
    assert x.grad.numpy().tolist() == [[0, 0, 1], [2, 0, 0]]
    with tc.no_grad():
        x.add_(1.0, alpha=2)
        x.mul_(tc.tensor(np.full(3, 2.0), device="cuda:1"))
        assert x.numpy().tolist() == [[4, 6, 8], [10, 12, 14]]
        x.copy_(np.ones((2, 3)))
        x.fill_(3.0)
    assert "cuda:1" in repr(x) and float(x.sum()) == 18.0 and x.data.device.id == 1
    import cupy

    with cupy.cuda.Device(1):
        on_1 = cupy.ones((4, 2, 3, 3), dtype=cupy.float32)
    assert tc.tensor(on_1).data.device.id == 1 and tc.tensor(tc.tensor(on_1)).data.device.id == 1
    norm = tc.nn.BatchNorm2d(2, affine=False).to(device="cuda:1")
    with tc.no_grad():
        norm.train()(tc.tensor(on_1))  # running statistics updated on GPU 1
        norm.eval()(tc.tensor(on_1))
    weight = tc.nn.Parameter(np.zeros(3, np.float32), device="cuda:1")
    assert tc.nn.init.constant_(weight, 0.5).data.device.id == 1  # filled where it lives, not moved
    dropped = F.dropout(tc.tensor(on_1), 0.5, training=True)
    assert dropped.data.device.id == 1 and set(np.unique(dropped.numpy())) <= {0.0, 2.0}
    print("ok")


def train_on_the_second_gpu(folder):
    """``train()`` with device "cuda:1" while GPU 0 is current: every array stays on GPU 1 (the
    trainer does not switch GPUs), the run equals the CPU run, and its checkpoint loads onto GPU 1."""
    folder = Path(folder)
    write_striped_dataset(folder / "data" / "tiny", (8, 4))
    config = dict(dataset="tiny", data_dir=str(folder / "data"), batch_size=4, epochs=1, lr=1e-3, lr_decay=0.9,
                  seed=0, augment=None, **TINY_MODEL)
    quiet = dict(show_progress=False, log=lambda *a: None)
    train(dict(config, device="cpu"), folder / "cpu", **quiet)
    tc.backend.use_device("cuda:0")
    train(dict(config, device="cuda:1"), folder / "gpu1", **quiet)
    assert tc.backend.current_cuda_device() == 0
    lines = {run: json.loads((folder / run / "metrics.jsonl").read_text().splitlines()[-1]) for run in ("cpu", "gpu1")}
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        np.testing.assert_allclose(lines["gpu1"][key], lines["cpu"][key], rtol=1e-5, err_msg=key)

    images = np.random.default_rng(1).random((3, 1, 10, 10)).astype(np.float32)
    labels = np.array([0, 1, 2])
    results = {}
    for run, device in (("cpu", "cpu"), ("gpu1", "cuda:1")):
        model, _ = load_checkpoint_model(folder / run / "checkpoints" / "last.npz", device=device)
        assert {p.data.device.id for p in model.parameters()} == {1} if device != "cpu" else True
        with tc.no_grad():  # the fused forward-only routing kernel on the GPU
            _, lengths, _ = model(tc.tensor(images, device=model.device))
        traces = []
        loss = batch_losses(model, images, labels, 0.0005, train=True, traces=traces)[0]
        loss.backward()
        statistics = routing_statistics(traces[0])  # computed where the trace's arrays live
        results[run] = [lengths.numpy(), loss.numpy()] + [p.grad.numpy() for p in model.parameters()]
        results[run].append(np.array([x for values in statistics.values() for x in values if isinstance(x, float)]))
    for got, want in zip(results["gpu1"], results["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    print("ok")


def nccl_one_rank(_):
    """The NCCL path on one rank: every collective's pointer, count and datatype are checked by the
    stand-in's NCCL (complex sums as their real view, unsigned and 64-bit types, a transposed
    view), and DDP's bucketed all-reduce on its own stream leaves one step equal to a plain one."""
    import cupy

    import tinygrad_caps.distributed as dist
    from tinygrad_caps.models.capsnet import CapsNet

    dist.init(backend="nccl")
    assert dist.get_backend() == "nccl" and dist.world_size() == 1
    x = cupy.full((3, 5), 2.0, dtype=cupy.float32)
    dist.all_reduce(x)
    t = tc.tensor(cupy.arange(6, dtype=cupy.float64).reshape(2, 3), device="cuda")
    dist.all_reduce(t, op="mean")
    assert float(x[0, 0]) == 2.0 and t.numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    view = cupy.ones((4, 3), dtype=cupy.float32).T
    dist.broadcast(view, root=0)
    for dtype, op in ((cupy.complex128, "sum"), (cupy.uint32, "max"), (cupy.int64, "min"), (cupy.uint64, "sum")):
        values = cupy.arange(5).astype(dtype)
        dist.all_reduce(values, op=op)
        assert values.tolist() == list(range(5)), (dtype, op)

    def one_step(model):
        optimizer = tc.optim.Adam(model.parameters(), lr=1e-3)
        images = np.random.default_rng(2).random((4, 1, 10, 10)).astype(np.float32)
        batch_losses(model, images, np.array([0, 1, 2, 0]), 0.0005, train=True)[0].backward()
        optimizer.step()
        module = model.module if isinstance(model, dist.DistributedDataParallel) else model
        return [p.numpy() for p in module.parameters()]

    def tiny_model():
        tc.manual_seed(0)
        return CapsNet(in_channels=1, image_size=10, num_classes=3, **TINY_MODEL).to(device="cuda")

    ddp = dist.DistributedDataParallel(tiny_model(), bucket_mb=0.001)
    assert len(ddp.buckets) > 2
    for got, want in zip(one_step(ddp), one_step(tiny_model())):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    dist.finalize()
    print("ok")


def nccl_runs_when_waited_for(_):
    """Under mpirun -n 2, one stand-in GPU per rank: a collective on a side stream runs only when
    something waits for it, so a reader that does not wait sees the old values (the race a GPU
    would allow), and a freed buffer is an error when the collective runs, as a GPU would corrupt
    memory. Without this, a missing wait in DDP would pass here."""
    import cupy

    import tinygrad_caps.distributed as dist
    from tinygrad_caps.distributed.process_group import nccl_all_reduce

    dist.init(backend="nccl")
    rank = dist.rank()
    side = cupy.cuda.Stream(non_blocking=True)
    x = cupy.full(4, float(rank + 1), dtype=cupy.float32)
    nccl_all_reduce(x, stream=side)
    assert float(x[0]) == rank + 1, "the collective ran before anything waited for it"
    done = side.record()
    cupy.cuda.get_current_stream().wait_event(done)
    assert float(x[0]) == 3.0, float(x[0])
    y = cupy.full(4, 1.0, dtype=cupy.float32)
    nccl_all_reduce(y, stream=side)
    cupy.cuda.Device().synchronize()  # the device's synchronize waits for every stream
    assert float(y[0]) == 2.0
    z = cupy.full(4, 1.0, dtype=cupy.float32)
    nccl_all_reduce(z, stream=side)
    del z
    expect(cupy.cuda.nccl.NcclError, side.synchronize, "a collective whose buffer was freed before it ran")
    dist.finalize()
    print("ok")


SCENARIOS = {f.__name__: f for f in (standin_refuses_what_cupy_refuses, tensor_api_on_the_second_gpu,
                                     train_on_the_second_gpu, nccl_one_rank, nccl_runs_when_waited_for)}

if __name__ == "__main__":  # NAME[,NAME...] [DIR]
    for name in sys.argv[1].split(","):
        SCENARIOS[name](sys.argv[2] if len(sys.argv) > 2 else None)
