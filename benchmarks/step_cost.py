"""What one CapsNet training step (forward, backward, Adam) must compute and move at least: FLOPs
and bytes per layer, from the model's sizes alone (nothing runs). train_step.py divides them by the
measured step time to say how far a step is from the GPU's peak and from its copy bandwidth.

FLOPs count the contractions only, 2 per multiply-add; the elementwise work (bias, ReLU, squash,
softmax, the mask, the losses, Adam's update) is well under 1% of them and is counted in bytes only.
Bytes count each layer's inputs, weights and outputs once (read or written), as if the elementwise
work beside a layer were fused into it, so they are a lower bound, not what any implementation moves.

Per layer, with B the batch, S the image side, C the image channels, K the kernel side, C1 conv1's
channels, H1 = S - K + 1, T PrimaryCaps' types of P values each, H2 = (H1 - K) // 2 + 1,
I = T * H2 * H2 input capsules, J classes of D values, R routing iterations, U = B*I*J*D (u_hat),
L = B*I*J (logits, couplings):

- conv1 (an im2col GEMM of (B*H1*H1, C*K*K) by (C*K*K, C1)): forward 2*B*H1^2*C1*C*K^2 FLOPs; backward
  the weight gradient only (the image needs none): 1x forward. Bytes: forward image + weight + bias +
  output; backward the output's gradient and the image read, the weight and bias gradients written.
- primary (PrimaryCaps, stride 2, GEMM (B*H2^2, C1*K^2) by (C1*K^2, T*P)): forward
  2*B*H2^2*T*P*C1*K^2; backward 2x forward (input and weight gradients). Bytes: forward input +
  weight + bias + output; backward the output's gradient, the input and the weight read, the input's
  gradient and the weight's and bias's written.
- predict (u_hat = W u, (I, J, D, P) by (B, I, P)): forward 2*U*P; backward 2x forward. Bytes:
  forward u, W read, u_hat written; backward u_hat's gradient read twice (one per adjoint), the
  gradients of W and u written (as routing_speed.py's ``minimum_bytes`` counts).
- routing (R weighted sums s = sum_i c u_hat, R - 1 agreements <u_hat, v>, gradient through every
  iteration): forward (2R - 1) * 2*U; backward 2x forward. Bytes: each of the 2R - 1 contractions
  reads u_hat and a logits-sized operand (U + L) forward, and backward reads u_hat and writes a
  u_hat-sized and a logits-sized gradient (2U + L).
- fc1, fc2, fc3 (the decoder, (B, n_in) by (n_in, n_out), J*D -> 512 -> 1024 -> C*S*S): forward
  2*B*n_in*n_out; backward 2x forward. Bytes: forward input + weight + bias + output; backward the
  output's gradient, the input and the weight read, the input's, weight's and bias's gradients written.
- adam (every parameter, N of them): no FLOPs counted; bytes 7N values (parameter, gradient and the
  two moments read; parameter and moments written).

    python benchmarks/step_cost.py [--batch 32 100]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class CapsNetSizes:
    """The sizes that set a CapsNet step's cost; the defaults are the paper's (and TorchCapsNet's)."""

    in_channels: int = 1
    image_size: int = 28
    kernel_size: int = 9
    conv1_channels: int = 256
    types: int = 32
    dim: int = 8
    num_classes: int = 10
    digit_dim: int = 16
    iterations: int = 3
    decoder: tuple = (512, 1024)

    @property
    def conv1_side(self) -> int:
        """H1: conv1's output side (a valid convolution)."""
        return self.image_size - self.kernel_size + 1

    @property
    def primary_side(self) -> int:
        """H2: PrimaryCaps' output side (stride 2)."""
        return (self.conv1_side - self.kernel_size) // 2 + 1

    @property
    def in_caps(self) -> int:
        """I: the number of primary capsules."""
        return self.types * self.primary_side ** 2


class LayerCost(NamedTuple):
    """One layer's FLOPs and bytes (at least), forward and backward."""

    name: str
    forward_flops: int
    backward_flops: int
    forward_bytes: int
    backward_bytes: int

    @property
    def flops(self) -> int:
        return self.forward_flops + self.backward_flops

    @property
    def bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes


class StepCost(NamedTuple):
    """A whole step: its layers (LayerCost, in order), their FLOPs and bytes summed, and the parameter count."""

    layers: tuple
    flops: int
    bytes: int
    parameters: int


def _gemm_layer(name, batch_rows, n_in, n_out, input_values, output_values, itemsize, input_gradient=True):
    """A layer that is one GEMM (batch_rows, n_in) x (n_in, n_out) plus a bias of n_out; ``input_values``
    and ``output_values`` are the sizes of its real input and output (an im2col layer reads its input,
    not the unfolded matrix). Returns (LayerCost, parameter count)."""
    forward_flops = 2 * batch_rows * n_in * n_out
    weights = n_in * n_out + n_out
    forward_values = input_values + weights + output_values
    # backward: the output's gradient and the input read, the weight and bias gradients written; with an
    # input gradient also the weight read and the input's gradient written
    backward_values = output_values + input_values + weights
    if input_gradient:
        backward_values += weights + input_values
    backward_flops = forward_flops * (2 if input_gradient else 1)
    cost = LayerCost(name, forward_flops, backward_flops, forward_values * itemsize, backward_values * itemsize)
    return cost, weights


def step_cost(batch: int, sizes: CapsNetSizes = CapsNetSizes(), itemsize: int = 4) -> StepCost:
    """The FLOPs and bytes of one training step at ``batch`` (see the module docstring for each formula).

    Args:
        batch: B, the images per step.
        sizes: the model's sizes (default: the paper's CapsNet).
        itemsize: bytes per value (4: float32).
    Returns:
        StepCost: layers conv1, primary, predict, routing, fc1, fc2, fc3, adam; flops and bytes summed.
    """
    s, k, c = sizes.image_size, sizes.kernel_size, sizes.in_channels
    h1, h2, c1 = sizes.conv1_side, sizes.primary_side, sizes.conv1_channels
    capsule_channels = sizes.types * sizes.dim
    layers, parameters = [], 0
    image, conv1_out = batch * c * s * s, batch * c1 * h1 * h1
    cost, n = _gemm_layer("conv1", batch * h1 * h1, c * k * k, c1, image, conv1_out, itemsize, input_gradient=False)
    layers.append(cost)
    parameters += n
    cost, n = _gemm_layer("primary", batch * h2 * h2, c1 * k * k, capsule_channels, conv1_out,
                          batch * capsule_channels * h2 * h2, itemsize)
    layers.append(cost)
    parameters += n

    i, j, d, p, r = sizes.in_caps, sizes.num_classes, sizes.digit_dim, sizes.dim, sizes.iterations
    u_hat, logits, w, u = batch * i * j * d, batch * i * j, i * j * d * p, batch * i * p
    layers.append(LayerCost("predict", 2 * u_hat * p, 4 * u_hat * p, (u + w + u_hat) * itemsize,
                            (2 * u_hat + w + u) * itemsize))
    parameters += w
    contractions = 2 * r - 1
    layers.append(LayerCost("routing", contractions * 2 * u_hat, contractions * 4 * u_hat,
                            contractions * (u_hat + logits) * itemsize, contractions * (2 * u_hat + logits) * itemsize))

    widths = [j * d, *sizes.decoder, c * s * s]
    for index, (n_in, n_out) in enumerate(zip(widths, widths[1:]), start=1):
        cost, n = _gemm_layer(f"fc{index}", batch, n_in, n_out, batch * n_in, batch * n_out, itemsize)
        layers.append(cost)
        parameters += n
    layers.append(LayerCost("adam", 0, 0, 0, 7 * parameters * itemsize))
    return StepCost(tuple(layers), sum(layer.flops for layer in layers), sum(layer.bytes for layer in layers),
                    parameters)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 100])
    args = parser.parse_args()
    for batch in args.batch:
        cost = step_cost(batch)
        print(f"B={batch}: {cost.flops / 1e9:.2f} GFLOP, {cost.bytes / 1e6:.1f} MB, {cost.parameters:,} parameters")
        for layer in cost.layers:
            print(f"  {layer.name:<8} {layer.forward_flops / 1e9:8.3f} + {layer.backward_flops / 1e9:8.3f} GFLOP   "
                  f"{layer.forward_bytes / 1e6:8.1f} + {layer.backward_bytes / 1e6:8.1f} MB")


if __name__ == "__main__":
    main()
