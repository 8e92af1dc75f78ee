"""Scenarios that run the GPU code path under the CPU stand-in for CuPy (``tests/support/cupy_standin``),
started by the stand-in tests (kernels/ and distributed/) in a process of their own through
support/standin.py: ``python standin_scenarios.py NAME DIR``. Each prints "ok" at its end; any
difference or error fails the process."""
import json
import sys
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.kernels import launch
from tinygrad_caps.models.analysis.routing_statistics import routing_statistics
from tinygrad_caps.models.app.training.checkpoints import load_checkpoint_model
from tinygrad_caps.models.app.training.trainer import batch_losses, train

from helpers import write_striped_dataset

TINY_MODEL = dict(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=3,
                  decoder_hidden=(16, 32))  # the paper's 512 and 1024 units were most of the emulated work


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


def capture_follows_cuda_rules(_):
    """Stream capture on the stand-in: what CuPy refuses inside a capture is refused, captured work
    leaves no trace until the graph is launched, a launch re-runs it on the current contents of its
    buffers, and a buffer freed after the capture is caught at the next launch."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    a = cupy.arange(4, dtype=cupy.float32)
    with stream:
        for refused, error in ((lambda: a.get(), RuntimeError), (lambda: float(a[0]), RuntimeError),
                               (lambda: cupy.asarray(np.ones(2)), RuntimeError),
                               (lambda: cupy.matmul(a[None], a[:, None]), NotImplementedError),
                               (lambda: cupy.einsum("i,i->", a, a), NotImplementedError),
                               (lambda: cupy.random.default_rng(0).random(3), NotImplementedError)):
            stream.begin_capture()
            expect(error, refused, "a host transfer, cuBLAS or cuRAND call in a capture")
            stream.end_capture()
        stream.begin_capture()
        expect(cupy.cuda.runtime.CUDARuntimeError, stream.synchronize, "a synchronize in a capture")
        expect(cupy.cuda.runtime.CUDARuntimeError, stream.end_capture, "a capture invalidated by a synchronize")
        stream.begin_capture()
        a *= 2
        b = a + 1
        graph = stream.end_capture()
    assert a.get().tolist() == [0, 1, 2, 3] and np.isnan(b.get()).all()  # nothing ran yet
    graph.launch(stream)
    graph.launch(stream)
    assert a.get().tolist() == [0, 1, 2, 3]  # a launch on a side stream runs when something waits for it
    stream.synchronize()
    assert a.get().tolist() == [0, 4, 8, 12] and b.get().tolist() == [1, 5, 9, 13]
    with stream:
        stream.begin_capture()
        c = (a * 3).sum()
        graph = stream.end_capture()
    del c
    graph.launch(stream)
    expect(cupy.cuda.GraphReplayError, stream.synchronize, "a graph replaying into a freed buffer")
    print("ok")


def captured_training_equals_eager(_):
    """Ten CapsNet steps captured as a CUDA graph (two warm-up steps, the capture, seven replays) equal
    ten eager steps (losses and weights to 1e-6), with capturable Adam whose learning rate changes
    between replays; the step's GEMMs go through kernels.gemm, its capsule ops through the RawKernels,
    its backward is the tape's."""
    import cupy
    from capsnet_steps import capsnet_training
    from tinygrad_caps.cuda_graphs import CaptureError, CapturedStep
    from tinygrad_caps.models import CapsNet

    rng = np.random.default_rng(0)
    batches = [(rng.random((4, 1, 10, 10), dtype=np.float32), rng.integers(0, 3, 4)) for _ in range(5)]

    def run(captured, capturable):
        losses, weights, state, runner = capsnet_training(batches, 10, captured, capturable, lr=1e-2,
                                                          lr_change=(6, 3e-3), in_channels=1, image_size=10,
                                                          num_classes=3, **TINY_MODEL)
        assert runner is None or (runner.captured and runner.graph.node_count > 50)
        return losses, weights, state

    eager_losses, eager_weights, eager_state = run(False, False)
    for captured, capturable in ((False, True), (True, True)):
        losses, weights, state = run(captured, capturable)
        np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
        for name in eager_weights:
            np.testing.assert_allclose(weights[name], eager_weights[name], rtol=1e-6, atol=1e-7, err_msg=name)
        assert [s["step"] for s in state["state"].values()] == [s["step"] for s in eager_state["state"].values()]
    # the optimizer's host arithmetic cannot be captured: the error names what failed
    tc.manual_seed(0)
    model = CapsNet(in_channels=1, image_size=10, num_classes=3, **TINY_MODEL).to(device="cuda")
    optimizer = tc.optim.Adam(model.parameters(), lr=1e-2)
    x = tc.zeros((4, 1, 10, 10), device="cuda")

    def host_reading_step():
        loss = model(x)[1].sum()
        optimizer.zero_grad()
        loss.backward()
        float(loss.data)

    runner = CapturedStep(host_reading_step, [x], warmup=1)
    runner(batches[0][0])
    expect(CaptureError, lambda: runner(batches[1][0]), "a step that reads a GPU value on the host")
    print("ok")


def training_captured_equals_eager(folder):
    """``train()`` on a stand-in GPU with the step captured as a CUDA graph (two warm-up batches, a
    capture, replays, an eager last batch of 4) equals the eager run: metrics and weights to 1e-6;
    a run stopped mid-epoch and resumed (captured again) equals both."""
    import os
    from tinygrad_caps.models.app.training.run_state import Interrupted

    folder = Path(folder)
    write_striped_dataset(folder / "data" / "tiny", (44, 12))  # 5 batches of 8, then one of 4
    config = dict(dataset="tiny", data_dir=str(folder / "data"), batch_size=8, epochs=2, lr=2e-3, lr_decay=0.5,
                  seed=0, augment="shift", device="cuda", **TINY_MODEL)
    quiet = dict(show_progress=False, log=lambda *a: None)
    train(dict(config, cuda_graph="off"), folder / "eager", **quiet)
    train(dict(config, cuda_graph="on"), folder / "graph", **quiet)
    os.environ["TINYGRAD_CAPS_TEST_CRASH"] = "optimizer-step@9:INT"  # in the second epoch, after a replay
    try:
        train(dict(config, cuda_graph="on"), folder / "cut", **quiet)
        raise AssertionError("the run was not interrupted")
    except Interrupted:
        pass
    finally:
        del os.environ["TINYGRAD_CAPS_TEST_CRASH"]
    train(dict(config, cuda_graph="on"), folder / "cut", resume=True, **quiet)
    runs = {run: [json.loads(line) for line in (folder / run / "metrics.jsonl").read_text().splitlines()]
            for run in ("eager", "graph", "cut")}
    weights = {run: tc.load(folder / run / "checkpoints" / "last.npz")["model"] for run in runs}
    for run in ("graph", "cut"):
        assert len(runs[run]) == 2, runs[run]
        for got, want in zip(runs[run], runs["eager"]):
            for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr"):
                np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=f"{run} {key}")
        for name, w in weights["eager"].items():
            np.testing.assert_allclose(weights[run][name], w, rtol=1e-6, atol=1e-7, err_msg=f"{run} {name}")
    print("ok")


def training_goes_on_eagerly_when_the_capture_fails(folder):
    """A model whose capsule prediction is too large for its kernel takes CuPy's einsum (cuBLAS),
    which a capture refuses: "auto" says why in one line and trains on eagerly, equal to a run with
    the graph off; "on" is a one-line UsageError."""
    from tinygrad_caps.models.errors import UsageError

    folder = Path(folder)
    write_striped_dataset(folder / "data" / "tiny", (32, 8))
    # DigitCaps' W[i] of 3 x 128 x 40 values does not fit the kernel's shared memory (12,288 float32)
    config = dict(dataset="tiny", data_dir=str(folder / "data"), batch_size=8, epochs=1, lr=2e-3, lr_decay=0.5,
                  seed=0, device="cuda", **dict(TINY_MODEL, primary_dim=40, digit_dim=128))
    said = []
    train(dict(config, cuda_graph="off"), folder / "eager", show_progress=False, log=lambda *a: None)
    train(dict(config, cuda_graph="auto"), folder / "auto", show_progress=False, log=said.append)
    fallback = [line for line in said if line.startswith("CUDA graph: off")]
    assert len(fallback) == 1 and "cuBLAS" in fallback[0], said
    runs = {run: json.loads((folder / run / "metrics.jsonl").read_text()) for run in ("eager", "auto")}
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        np.testing.assert_allclose(runs["auto"][key], runs["eager"][key], rtol=1e-6, err_msg=key)
    expect(UsageError, lambda: train(dict(config, cuda_graph="on"), folder / "on", show_progress=False,
                                     log=lambda *a: None), "a capture that fails under --cuda-graph on")
    print("ok")


def dlpack_on_the_gpu(_):
    """DLPack on stand-in GPU 1: a tensor's memory is shared with CuPy both ways, the device is
    kept, and a gradient on imported data flows as on any tensor."""
    import cupy

    t = tc.tensor(np.arange(6.0).reshape(2, 3), device="cuda:1", requires_grad=True)
    assert t.__dlpack_device__() == (2, 1)
    shared = cupy.from_dlpack(t)
    with cupy.cuda.Device(1):
        shared[0, 0] = 7.0
    assert t.numpy()[0, 0] == 7.0 and shared.device.id == 1
    imported = tc.from_dlpack(shared, requires_grad=True)
    assert imported.device == "cuda:1"
    (imported * imported).sum().backward()
    assert imported.grad.numpy().tolist() == [[14.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    expect(ValueError, lambda: tc.from_dlpack(_OtherDevice()), "memory of a device type without arrays here")
    print("ok")


class _OtherDevice:
    """Something that says its memory lives on a Vulkan device (DLPack device type 7)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("never asked for: the device is refused first")

    def __dlpack_device__(self):
        return (7, 0)


def gemm_layouts_and_precision(_):
    """kernels.gemm on every operand layout the engine passes (C-contiguous, transposed views,
    strided slices, batched), against NumPy; "high" rounds float32 operands to TF32."""
    import cupy
    from tinygrad_caps.kernels import gemm

    rng = np.random.default_rng(0)
    a_host, b_host = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    a, b = cupy.asarray(a_host), cupy.asarray(b_host)
    cases = [(a, b, a_host @ b_host), (cupy.asarray(a_host.T.copy()).T, b, a_host @ b_host),
             (a, cupy.asarray(b_host.T.copy()).T, a_host @ b_host),
             (cupy.asarray(np.ascontiguousarray(a_host[:, ::-1])), b[::-1], a_host[:, ::-1] @ b_host[::-1]),
             (a[::2], b, a_host[::2] @ b_host)]
    batch_a, batch_b = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 5, 2))
    cases.append((cupy.asarray(batch_a), cupy.asarray(batch_b).swapaxes(1, 2).copy().swapaxes(1, 2), batch_a @ batch_b))
    for x, y, want in cases:
        np.testing.assert_allclose(gemm.matmul(x, y).get(), want, rtol=1e-5, atol=1e-5)
    out = cupy.empty((7, 3), dtype=cupy.float32)
    assert gemm.matmul(a, b, out=out) is out
    gemm.set_precision("high")
    try:
        rounded = gemm.matmul(a, b).get()
    finally:
        gemm.set_precision("highest")
    assert not np.array_equal(rounded, gemm.matmul(a, b).get())
    np.testing.assert_allclose(rounded, a_host @ b_host, rtol=1e-2, atol=1e-2)
    expect(ValueError, lambda: gemm.matmul(a, a), "a product whose inner sizes differ")
    print("ok")


SCENARIOS = {f.__name__: f for f in (standin_refuses_what_cupy_refuses, tensor_api_on_the_second_gpu,
                                     train_on_the_second_gpu, nccl_one_rank, nccl_runs_when_waited_for,
                                     capture_follows_cuda_rules, captured_training_equals_eager,
                                     gemm_layouts_and_precision, training_captured_equals_eager,
                                     dlpack_on_the_gpu, training_goes_on_eagerly_when_the_capture_fails)}

if __name__ == "__main__":  # NAME[,NAME...] [DIR]
    for name in sys.argv[1].split(","):
        SCENARIOS[name](sys.argv[2] if len(sys.argv) > 2 else None)
