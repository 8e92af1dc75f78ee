"""Scenarios for a captured step's private memory pool (``tinygrad_caps.graph_pool``) under the CPU
stand-in for CuPy, each in a process of its own (support/standin.py): ``python graph_pool_scenarios.py
NAME[,NAME...]``. Each prints "ok" at its end (the CapsNet one first prints its figures as JSON);
any difference or error fails the process."""
import json
import sys
import weakref

import numpy as np

import tinygrad_caps as tc

TINY_MODEL = dict(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=3, in_channels=1,
                  image_size=10, num_classes=3)
# where the sizes are not the point: a decoder of 16 and 32 units instead of the paper's 512 and 1024
# (the memory figures keep them: the pool's rounding would weigh more on buffers of a few hundred bytes)
SMALLER_DECODER = dict(decoder_hidden=(16, 32))


def a_capture_reuses_what_it_frees(_):
    """In a capture on a pool of its own, a buffer freed is reused by the next allocation that fits
    (the pool holds two buffers for three); the replay computes what eager code does; a step that
    reads a buffer after it was freed reads garbage at every replay (as on a GPU, where its memory
    is another array's); giving the blocks back leaves what live arrays hold."""
    import cupy

    pool, stream = cupy.cuda.MemoryPool(), cupy.cuda.Stream(non_blocking=True)
    a = cupy.arange(1000, dtype=cupy.float32)
    out = cupy.zeros(1000, dtype=cupy.float32)
    with stream, cupy.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        t = a * 2                      # 4000 bytes: a chunk of 4096
        s = t + 1
        freed = weakref.ref(t._a)      # what a kernel holding a raw pointer to t would see
        del t
        u = s * 3                      # t's chunk again
        stream._capture.record(np.copyto, (out._a, freed()), {}, None, "a read after the free")
        graph = stream.end_capture()
    assert pool.total_bytes() == 2 * 4096 and pool.used_bytes() == 2 * 4096, (pool.total_bytes(), pool.used_bytes())
    a[...] = 1
    graph.launch(stream)
    stream.synchronize()
    assert (u.get() == 9).all() and (s.get() == 3).all()
    assert np.isnan(out.get()).all()  # the freed buffer was overwritten before the late read
    del graph, u
    pool.free_all_blocks()
    assert pool.total_bytes() == 4096 and pool.used_bytes() == 4096  # s's segment stays
    del s
    pool.free_all_blocks()
    assert pool.total_bytes() == 0
    print("ok")


def _capsnet(batches, **options):
    """A seeded tiny CapsNet (``options`` beside TINY_MODEL's) on "cuda" with its step (capturable Adam)
    and static inputs."""
    import cupy
    from tinygrad_caps.models import CapsNet
    from tinygrad_caps.models.app.training.step import capsnet_training_step

    tc.manual_seed(0)
    model = CapsNet(**TINY_MODEL, **options).to(device="cuda")
    x = tc.zeros(batches[0][0].shape, device="cuda")
    y = tc.zeros(batches[0][1].shape, dtype=np.int64, device="cuda")
    optimizer, train_step = capsnet_training_step(model, x, y.data, lr=1e-2, capturable=True)
    losses = cupy.zeros(16, dtype=cupy.float64)
    index = cupy.zeros(1, dtype=cupy.int64)

    def step():
        losses[index] = train_step().data
        index[...] += 1

    return model, optimizer, step, x, y, losses


def _allocation_counter():
    """A memory hook summing every allocation (``total``): what a capture that kept them all would hold."""
    import cupy

    class Allocated(cupy.cuda.MemoryHook):
        total = 0

        def malloc_postprocess(self, **info):
            self.total += info["mem_size"]

    return Allocated()


def a_captured_capsnet_step_needs_about_the_eager_peak(_):
    """A CapsNet training step captured on the graph's own pool holds at most 1.1x the eager step's
    peak (measured without the previous step's gradients, which the eager step frees and a
    captured one replaces from its pool), less than all it allocates; six replays give the
    eager losses and weights; close() gives the pool back, and the gradients made in the
    capture give theirs when they go."""
    import cupy
    from tinygrad_caps import graph_pool
    from tinygrad_caps.cuda_graphs import CapturedStep

    rng = np.random.default_rng(0)
    batches = [(rng.random((4, 1, 10, 10), dtype=np.float32), rng.integers(0, 3, 4)) for _ in range(3)]
    model, optimizer, step, x, y, losses = _capsnet(batches)
    for k in range(8):
        x.data[...] = cupy.asarray(batches[k % 3][0])
        y.data[...] = cupy.asarray(batches[k % 3][1])
        if k == 2:
            with_grads = graph_pool.step_peak_bytes(step, "cuda")  # the previous gradients are freed inside
        elif k == 3:
            optimizer.zero_grad()
            eager_peak = graph_pool.step_peak_bytes(step, "cuda")
        elif k == 4:
            allocated = _allocation_counter()
            with allocated:
                step()
        else:
            step()
    eager_losses, eager_weights = losses.get()[:8], {n: tc.backend.to_numpy(v) for n, v in model.state_dict().items()}

    model, optimizer, step, x, y, losses = _capsnet(batches)
    runner = CapturedStep(step, [x, y], warmup=2)
    for k in range(8):
        runner(*batches[k % 3])
    runner.synchronize()
    captured = runner.captured_bytes
    np.testing.assert_allclose(losses.get()[:8], eager_losses, rtol=1e-6)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(tc.backend.to_numpy(value), eager_weights[name], rtol=1e-6, atol=1e-7, err_msg=name)
    print(json.dumps({"captured_bytes": captured, "eager_peak_bytes": eager_peak,
                      "eager_peak_with_previous_grads_bytes": with_grads, "allocated_in_a_step_bytes": allocated.total,
                      "ratio": captured / eager_peak}))
    assert 0 < captured <= 1.1 * eager_peak, (captured, eager_peak)
    assert captured < allocated.total, (captured, allocated.total)  # memory freed in the step was reused
    runner.close()
    assert runner.captured_bytes == 0 and len(graph_pool._retired) == 1  # the gradients are the capture's
    optimizer.zero_grad()
    graph_pool._drop_retired()
    assert graph_pool._retired == []
    print("ok")


def freeing_a_buffer_a_live_graph_uses_is_caught(_):
    """The stand-in's record of buffers freed while a graph that uses them lives
    (``cupy.cuda.standin_freed_graph_buffers``) sees each way such a buffer goes: its pool given back
    under the live graph, a default-pool array the graph wrote dying after the capture, a default-pool
    temporary dying within the capture; and none once the graph is gone first (as ``close`` does)."""
    import gc

    import cupy
    from tinygrad_caps.graph_pool import GraphPool

    def capture(pool=None):
        stream = cupy.cuda.Stream(non_blocking=True)
        a = cupy.arange(8, dtype=cupy.float32)
        with stream, (pool.allocating() if pool is not None else cupy.cuda.using_allocator(None)):
            stream.begin_capture()
            t = a * 2          # a temporary, gone before the capture ends
            b = t + 1
            del t
            graph = stream.end_capture()
        return graph, a, b

    freed = cupy.cuda.standin_freed_graph_buffers
    pool = GraphPool("cuda")
    graph, a, b = capture(pool)
    assert freed() == []                       # the temporary's memory stayed with the graph's pool
    del b
    pool.release()                             # ... which gives it back under the live graph
    messages = freed()
    assert len(messages) == 2 and all("went back to the device while the graph lives" in m for m in messages), messages
    cupy.cuda.standin_forget_freed_graph_buffers()

    graph, a, b = capture()                    # the default pool: its temporary went back in the capture
    assert len(freed()) == 1 and "during its capture" in freed()[0], freed()
    del b
    gc.collect()
    assert len(freed()) == 2 and "while the graph lives" in freed()[1], freed()
    cupy.cuda.standin_forget_freed_graph_buffers()

    pool = GraphPool("cuda")
    graph, a, b = capture(pool)
    del graph, b                               # the graph first, then its memory: nothing to report
    pool.release()
    gc.collect()
    assert freed() == [], freed()

    from tinygrad_caps.kernels import gemm

    stream, pool = cupy.cuda.Stream(non_blocking=True), GraphPool("cuda")
    x = cupy.ones((3, 3), dtype=cupy.float32)
    gemm.matmul(x, x)                          # the workspace is made outside the capture, as in a warm-up
    with stream, pool.allocating():
        stream.begin_capture()
        y = gemm.matmul(x, x)
        graph = stream.end_capture()
    gemm._workspaces.clear()                   # cuBLAS's workspace let go under the graph
    gc.collect()
    assert len(freed()) == 1 and "cublasGemmEx" in freed()[0] and "uint8" in freed()[0], freed()
    cupy.cuda.standin_forget_freed_graph_buffers()
    print("ok")


def a_captured_step_keeps_every_buffer_it_uses(_):
    """A captured CapsNet step, with what benchmarks/train_step.py does around its graphs in one
    process: another captured step built and dropped without close (graph_matches_eager), CuPy's
    default pool emptied, eager steps of another model, a second capture (which empties the default
    pool again), an eager step's peak measured with its gradients dropped, arrays made and freed.
    No buffer the live graph reads or writes (its pool, the parameters, Adam's state, the static
    inputs, cuBLAS's workspace) goes back to the device while it lives, and its replays still give
    the eager step's weights."""
    import gc

    import cupy
    from tinygrad_caps import graph_pool
    from tinygrad_caps.cuda_graphs import CapturedStep

    freed = cupy.cuda.standin_freed_graph_buffers
    rng = np.random.default_rng(0)
    batches = [(rng.random((4, 1, 10, 10), dtype=np.float32), rng.integers(0, 3, 4)) for _ in range(2)]

    def captured(steps):
        model, optimizer, step, x, y, losses = _capsnet(batches, **SMALLER_DECODER)
        runner = CapturedStep(step, [x, y], warmup=2)
        for k in range(steps):
            runner(*batches[k % 2])
        runner.synchronize()
        return model, optimizer, runner

    _, _, dropped = captured(3)                # built and dropped without close, as graph_matches_eager does
    del dropped
    gc.collect()
    model, optimizer, runner = captured(3)     # the graph that must keep its buffers from here on
    cupy.get_default_memory_pool().free_all_blocks()
    other, other_optimizer, other_step, *_ = _capsnet(batches, **SMALLER_DECODER)
    other_step()
    other_step()
    _, _, second = captured(3)                 # its capture gives CuPy's cached blocks back to the device
    other_optimizer.zero_grad()
    graph_pool.step_peak_bytes(other_step, "cuda")
    del other, other_optimizer, other_step
    for size in (10, 1000, 100000):
        junk = cupy.full(size, 7, dtype=cupy.int64)
        del junk
    gc.collect()
    for k in range(3, 6):
        runner(*batches[k % 2])
    runner.synchronize()
    assert freed() == [], freed()
    eager, _, eager_step, x, y, _ = _capsnet(batches, **SMALLER_DECODER)
    for k in range(6):
        x.data[...] = cupy.asarray(batches[k % 2][0])
        y.data[...] = cupy.asarray(batches[k % 2][1])
        eager_step()
    for (name, want), (_, got) in zip(eager.state_dict().items(), model.state_dict().items()):
        np.testing.assert_allclose(tc.backend.to_numpy(got), tc.backend.to_numpy(want), rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    second.close()
    runner.close()
    optimizer.zero_grad()
    gc.collect()
    assert freed() == [], freed()
    print("ok")


SCENARIOS = {f.__name__: f for f in (a_capture_reuses_what_it_frees,
                                     a_captured_capsnet_step_needs_about_the_eager_peak,
                                     freeing_a_buffer_a_live_graph_uses_is_caught,
                                     a_captured_step_keeps_every_buffer_it_uses)}

if __name__ == "__main__":  # NAME[,NAME...] [DIR]
    for name in sys.argv[1].split(","):
        SCENARIOS[name](sys.argv[2] if len(sys.argv) > 2 else None)
