"""A CapsNet trained step by step on the GPU, eagerly or captured as a CUDA graph, each step's loss
kept on the device: what the capture tests compare (on the stand-in and on a real GPU).

The step is the package's (``capsnet_training_step``, which the benchmarks time too); this one also
writes each step's loss into a device array, which a replay of the captured graph must do too."""
import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.cuda_graphs import CapturedStep
from tinygrad_caps.models import CapsNet
from tinygrad_caps.models.app.training.step import capsnet_training_step


def capsnet_training(batches, steps, captured, capturable=True, lr=1e-3, lr_change=None, **model_options):
    """Train ``CapsNet(**model_options)`` on "cuda" for ``steps`` steps over ``batches`` (cycled
    (images, labels) pairs of one shape), captured after two warm-up steps or eagerly; ``lr_change``
    is (step, new rate). Returns (losses (steps,), {name: weights}, the optimizer's state_dict, the
    CapturedStep or None)."""
    import cupy

    tc.manual_seed(0)
    model = CapsNet(**model_options).to(device="cuda")
    images, labels = batches[0]
    x = tc.zeros(images.shape, device="cuda")
    y = tc.zeros(labels.shape, dtype=np.int64, device="cuda")
    optimizer, train_step = capsnet_training_step(model, x, y.data, lr=lr, capturable=capturable)
    losses = cupy.zeros(steps, dtype=cupy.float64)
    index = cupy.zeros(1, dtype=cupy.int64)

    def step():
        losses[index] = train_step().data  # recorded on the device: a replay writes its own loss
        index[...] += 1

    runner = CapturedStep(step, [x, y], warmup=2) if captured else None
    for k in range(steps):
        if lr_change is not None and k == lr_change[0]:
            optimizer.lr = lr_change[1]  # a replay must follow the change
        images, labels = batches[k % len(batches)]
        if runner is not None:
            runner(images, labels)
        else:
            x.data[...] = cupy.asarray(images)
            y.data[...] = cupy.asarray(labels)
            step()
    if runner is not None:
        runner.synchronize()
    weights = {name: tc.backend.to_numpy(value) for name, value in model.state_dict().items()}
    return losses.get(), weights, optimizer.state_dict(), runner
