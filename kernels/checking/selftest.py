"""Every kernel on the GPU against NumPy: ``python -m tinygrad_caps.kernels.checking.selftest [--small]``.

``--small`` runs the emulation's shapes only (``emulation.selfcheck``: tails, partial warps,
vector and scalar paths, 32- and 64-bit indices), which keeps a run under
``compute-sanitizer --tool memcheck`` or ``--tool racecheck`` short; without it, CapsNet's own
sizes follow (B=100, 1152 input capsules, 10 x 16 outputs, PrimaryCaps' 9x9 convolution).
Exits 1 on any mismatch and 2 when there is no GPU.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .emulation import selfcheck
from .reference import reference_routing


def capsnet_sized_check(cp) -> list[str]:
    """The kernels at CapsNet's sizes in float32 against float64 NumPy; returns failures."""
    from .. import activation, capsule, conv, optim, routing
    from .reference import reference_adam, reference_softmax, reference_softmax_grad, reference_squash, \
        reference_squash_grad

    rng = np.random.default_rng(0)
    failures = []

    def compare(name, got, want, tol=2e-3):
        got = cp.asnumpy(got)
        error = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
        if not error < tol:
            failures.append(f"{name}: relative error {error:.2e}")

    u, w = rng.standard_normal((100, 1152, 8)), rng.standard_normal((1152, 10, 16, 8)) * 0.1
    g = rng.standard_normal((100, 1152, 10, 16))
    c, v = rng.random((100, 1152, 10)), rng.standard_normal((100, 10, 16))
    f32 = [cp.asarray(a, dtype=cp.float32) for a in (u, w, g, c, v)]
    compare("capsule_predict", capsule.capsule_predict(f32[0], f32[1]), np.einsum("ijdk,bik->bijd", w, u))
    grad_u, grad_w = capsule.capsule_grad(f32[2], f32[0], f32[1])
    compare("capsule_grad (u)", grad_u, np.einsum("ijdk,bijd->bik", w, g))
    compare("capsule_grad (W)", grad_w, np.einsum("bijd,bik->ijdk", g, u))
    compare("routing_weighted_sum", routing.routing_weighted_sum(f32[3], f32[2]), np.einsum("bij,bijd->bjd", c, g))
    compare("routing_agreement", routing.routing_agreement(f32[2], f32[4]), np.einsum("bijd,bjd->bij", g, v))
    terms = rng.standard_normal((5, 100, 1152, 10)), rng.standard_normal((5, 100, 10, 16))
    compare("routing_outer_products", routing.routing_outer_products(*(cp.asarray(t, dtype=cp.float32) for t in terms)),
            np.einsum("tbij,tbjd->bijd", *terms))
    compare("squash_rows", activation.squash_rows(f32[2]), reference_squash(g, 1e-8))
    compare("squash_rows_grad", activation.squash_rows_grad(f32[2], f32[2] * 0.5), reference_squash_grad(g, g * 0.5, 1e-8))
    compare("softmax_rows", activation.softmax_rows(f32[3]), reference_softmax(c))
    compare("softmax_rows_grad", activation.softmax_rows_grad(f32[3], f32[3] * 2), reference_softmax_grad(c, 2 * c))
    adam = [w.reshape(-1), w.reshape(-1) * 0.1, w.reshape(-1) * 0.01, np.abs(w.reshape(-1)) * 1e-3]
    adam_gpu = [cp.asarray(a, dtype=cp.float32) for a in adam]
    hyper = dict(step=5, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False)
    optim.adam_step(*adam_gpu, None, **hyper)
    compare("adam_step", adam_gpu[0], reference_adam(*adam, None, **hyper)[0])
    u_hat = g * 0.01
    fused_v, _, _ = routing.routing_forward(cp.asarray(u_hat, dtype=cp.float32), 3)
    compare("routing_forward", fused_v, reference_routing(u_hat, 3, 1e-8)[0])
    single_v, _, _ = routing.routing_forward(cp.asarray(u_hat, dtype=cp.float32), 3, slices=routing.SINGLE_BLOCK)
    compare("routing_forward (one block per example)", single_v, reference_routing(u_hat, 3, 1e-8)[0])
    x = rng.standard_normal((100, 256, 20, 20))
    col = conv.im2col(cp.asarray(x, dtype=cp.float32), (9, 9), (2, 2), (0, 0), False)
    back = conv.col2im(col, x.shape, (9, 9), (2, 2), (0, 0), False)
    # col2im(im2col(x)) multiplies each pixel by how many windows cover it
    ones = conv.col2im(cp.ones_like(col), x.shape, (9, 9), (2, 2), (0, 0), False)
    compare("im2col then col2im", back, x * cp.asnumpy(ones))
    return failures


def main(argv=None) -> int:
    """Run the self-test; returns the exit status (0 all agree, 1 a mismatch, 2 no GPU)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="small shapes only (for compute-sanitizer)")
    parser.add_argument("--no-pool", action="store_true",
                        help="allocate every array with cudaMalloc (no CuPy memory pool), so that "
                             "compute-sanitizer's memcheck sees each array's true end")
    args = parser.parse_args(argv)
    try:
        import cupy as cp

        device = cp.cuda.Device()
        name = cp.cuda.runtime.getDeviceProperties(device.id)["name"].decode()
        if args.no_pool:
            cp.cuda.set_allocator(None)
    except Exception as exc:  # no CuPy, no driver, no device
        print(f"selftest: no usable GPU ({exc})")
        return 2
    failures = selfcheck(None, to_device=cp.asarray, to_host=cp.asnumpy)
    if not args.small:
        failures += capsnet_sized_check(cp)
    cp.cuda.Device().synchronize()
    for failure in failures:
        print("FAIL", failure)
    print(f"selftest on {name}: {'all kernels agree with NumPy' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
