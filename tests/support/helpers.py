"""Hypothesis strategies shared by the gradient property tests, and helpers shared by the tests
that run processes (mpirun ranks, the CLI, the CuPy stand-in)."""
import gzip
import os
import signal
import sys

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tinygrad_caps.distributed.launch import mpi_available
from tinygrad_caps.testing import check_gradients


def floats(low=-2.0, high=2.0):
    return st.floats(low, high, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def away_from_zero(low=0.1, high=2.0):
    """Values in [-high, -low] U [low, high]: keeps finite differences off a kink at 0."""
    return st.one_of(floats(low, high), floats(-high, -low))


def on_grid(offset=0.0):
    """Values k/10 + offset in [-2, 2]: two grids with offsets 0 and 0.05 never tie."""
    return st.integers(-20, 20).map(lambda k: k / 10 + offset)


def shapes(min_dims=0, max_dims=3, min_side=1, max_side=3):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


@st.composite
def arrays(draw, shape, elements=None, unique=False):
    """A float64 array of ``shape``; for 2+ dimensions sometimes a transposed (non-contiguous) view."""
    shape = tuple(shape)
    as_view = len(shape) >= 2 and draw(st.booleans())
    base = tuple(reversed(shape)) if as_view else shape
    a = draw(hnp.arrays(np.float64, base, elements=elements if elements is not None else floats(), unique=unique))
    return a.T if as_view else a


def check_both(f, inputs, **kw):
    """Backward and double backward of ``f`` against central differences, and no write into the
    inputs or the upstream gradient (``tinygrad_caps.testing.check_gradients``)."""
    check_gradients(f, inputs, double=True, **kw)


def write_striped_dataset(folder, counts, *, size=10, cycle_labels=False, stripe_end=8, compress=True):
    """A tiny learnable IDX dataset in ``folder``: ``counts`` = (train, test) images of size x size,
    3 classes (drawn at random, or 0, 1, 2, 0, ... with ``cycle_labels``), each image dim noise with a
    bright stripe at rows 2 + 3 * label (2 rows, columns 2 .. stripe_end - 1); seeded, so repeatable."""
    from tinygrad_caps.data import write_idx

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for stem, n in zip(("train", "t10k"), counts):
        labels = (np.arange(n) % 3).astype(np.uint8) if cycle_labels else rng.integers(0, 3, n).astype(np.uint8)
        images = (rng.random((n, size, size)) * 60).astype(np.uint8)
        for k, label in enumerate(labels):
            images[k, 2 + 3 * label:4 + 3 * label, 2:stripe_end] = 255
        suffix = ".gz" if compress else ""
        write_idx(folder / f"{stem}-images-idx3-ubyte{suffix}", images, compress=compress)
        write_idx(folder / f"{stem}-labels-idx1-ubyte", labels)


def metrics_without_times(out):
    """The lines of ``out/metrics.jsonl`` as dicts, without their wall-clock ``seconds``."""
    import json

    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        line.pop("seconds")
    return lines


def gpu_count() -> int:
    """How many CUDA GPUs CuPy sees (0 without a usable GPU)."""
    import tinygrad_caps as tc

    cp = tc.backend.cupy_module()
    return cp.cuda.runtime.getDeviceCount() if cp is not None and tc.gpu_available() else 0


def routing_and_conv_gradients(u_shape, w_shape, w_scale, x_shape, k_shape, device="cpu", dtype=np.float64):
    """[loss, first-order gradients, second-order gradients] of a loss through the capsule prediction,
    3 routing iterations, a stride-2 convolution and its transpose, for u, W, an image x and a kernel k
    drawn with seed 5 (the arrays come back as NumPy): every kernel-backed op, to second order."""
    import tinygrad_caps as tc
    import tinygrad_caps.functional as F

    rng = np.random.default_rng(5)
    u = tc.tensor(rng.standard_normal(u_shape).astype(dtype), device=device, requires_grad=True)
    w = tc.tensor((rng.standard_normal(w_shape) * w_scale).astype(dtype), device=device, requires_grad=True)
    x = tc.tensor(rng.standard_normal(x_shape).astype(dtype), device=device, requires_grad=True)
    k = tc.tensor(rng.standard_normal(k_shape).astype(dtype), device=device, requires_grad=True)
    u_hat = F.capsule_predict(u, w)
    logits = tc.zeros(u_shape[:2] + w_shape[1:2], dtype=dtype, device=device)
    for r in range(3):
        v = F.squash(F.routing_weighted_sum(F.softmax(logits, axis=2), u_hat))
        if r < 2:
            logits = logits + F.routing_agreement(u_hat, v)
    loss = (v * v).sum() + (F.conv_transpose2d(F.conv2d(x, k, None, 2, 1), k, None, 2, 1) ** 2).sum()
    grads = tc.grad(loss, [u, w, x, k], create_graph=True)
    second = tc.grad(sum((g * g).sum() for g in grads), [u, w, x, k])
    return [loss.numpy()] + [g.numpy() for g in grads + second]


def run_with_group_timeout(args, timeout, **kwargs):
    """``subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)``, except that
    a timeout kills the whole process group: killing ``mpirun`` alone leaves its ranks running."""
    import os
    import signal
    import subprocess

    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          **kwargs) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def with_default_sigint() -> None:
    """``preexec_fn`` of a child process a test stops with SIGINT: the child starts with SIGINT at its
    default disposition, as a command typed at a terminal does. A suite started as a background job of a
    script (``pytest ... &``) inherits SIGINT ignored, its children too, and Python then installs no
    KeyboardInterrupt handler: a ``study run`` driver would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def damaged_npy_header(npy: bytes) -> bytes:
    """The bytes of a .npy file with its header dict's closing brace blanked out: NumPy's header
    parser then raises tokenize.TokenError (unclosed brace), which is not a ValueError."""
    assert b"), }" in npy, "not a .npy header that NumPy writes"
    return npy.replace(b"), }", b"),  ", 1)


def damaged_deflate(data: bytes) -> bytes:
    """gzip-compressed ``data`` whose deflate stream is damaged (its first block claims the reserved
    block type), so that reading it raises zlib.error, which is not an OSError."""
    compressed = gzip.compress(data)  # a 10-byte header: no file name
    return compressed[:10] + b"\xff" + compressed[11:]


# ----- processes under mpirun, and the train command on a tiny dataset -----
MPI_OK, MPI_WHY = mpi_available()
# CI sets TINYGRAD_CAPS_REQUIRE_MPI=1: there a missing MPI is a failure, not a skip.
needs_mpi = pytest.mark.skipif(not MPI_OK and os.environ.get("TINYGRAD_CAPS_REQUIRE_MPI") != "1", reason=MPI_WHY)


def single_thread_env():
    """Environment for ranks: one BLAS thread each (2 ranks on 2 cores), no launcher variables of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", TINYGRAD_CAPS_DEVICE="cpu")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")  # every rank is on this machine (which may have no network)
    # a rank waiting for another yields its core (Open MPI spins otherwise): other tests run beside them
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    return env


TINY_TRAIN = ["--dataset", "tiny", "--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4",
              "--digit-dim", "4", "--kernel-size", "3", "--decoder-hidden", "16,32", "--batch-size", "16",
              "--dtype", "float64", "--augment", "none", "--no-progress"]


def write_tiny_data(root):
    """The "tiny" dataset of the train-command tests (64 training, 32 test images) under ``root/tiny``; returns ``root``."""
    write_striped_dataset(root / "tiny", (64, 32), size=12, cycle_labels=True, stripe_end=9)
    return root


def train_command(data_dir, out, *extra):
    """``tinygrad-caps train`` of a small float64 CapsNet on the tiny dataset in ``data_dir``."""
    return [sys.executable, "-m", "tinygrad_caps.models.cli", "train", "--data-dir", str(data_dir), "--out", str(out),
            *TINY_TRAIN, *extra]


def assert_metrics_close(a, b, tolerance=1e-10):
    """Two runs' metrics lines (``metrics_without_times``) agree, key by key, to ``tolerance`` relative."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert abs(x[key] - y[key]) <= tolerance * max(abs(y[key]), 1e-300), (key, x[key], y[key])
