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


def _capsnet(batches):
    """A seeded tiny CapsNet on "cuda" with its step (capturable Adam) and static inputs."""
    import cupy
    from tinygrad_caps.models import CapsNet
    from tinygrad_caps.models.app.training.step import capsnet_training_step

    tc.manual_seed(0)
    model = CapsNet(**TINY_MODEL).to(device="cuda")
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


SCENARIOS = {f.__name__: f for f in (a_capture_reuses_what_it_frees,
                                     a_captured_capsnet_step_needs_about_the_eager_peak)}

if __name__ == "__main__":  # NAME[,NAME...] [DIR]
    for name in sys.argv[1].split(","):
        SCENARIOS[name](sys.argv[2] if len(sys.argv) > 2 else None)
