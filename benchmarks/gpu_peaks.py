"""Datasheet peaks of the GPUs the benchmarks run on: dense FP32 and TF32 throughput and memory
bandwidth, picked by the device name CUDA reports.

Sources (NVIDIA's datasheets; their TF32 figures are "with sparsity", and dense is half of them):
- H100 SXM, PCIe and NVL: "NVIDIA H100 Tensor Core GPU" datasheet,
  https://www.nvidia.com/en-us/data-center/h100/ (SXM: FP32 67 TFLOPS, TF32 989* TFLOPS, 3.35 TB/s;
  PCIe: 51, 756*, 2.0 TB/s; NVL: 60, 835*, 3.9 TB/s).
- H200 SXM and NVL: "NVIDIA H200 Tensor Core GPU" datasheet, https://www.nvidia.com/en-us/data-center/h200/
  (SXM: FP32 67 TFLOPS, TF32 989* TFLOPS, 4.8 TB/s; NVL: 60, 835*, 4.8 TB/s).
"""
from __future__ import annotations

from typing import NamedTuple


class Peak(NamedTuple):
    """One GPU's datasheet peaks: dense FP32 (CUDA cores) and TF32 (tensor cores) in FLOP/s, memory bytes/s."""

    name: str
    fp32_flops: float
    tf32_flops: float
    memory_bytes_per_s: float

    def flops(self, precision: str) -> float:
        """The peak that bounds a step at ``precision``: "highest" FP32, "high" TF32 (FLOP/s)."""
        return {"highest": self.fp32_flops, "high": self.tf32_flops}[precision]


# (name fragments that must all appear in the device's name, lower case) -> peaks; the first match wins,
# so the variants named by a suffix (NVL, PCIe) come before the plain name (SXM, e.g. "NVIDIA H100 80GB HBM3")
PEAKS = (
    (("h200", "nvl"), Peak("H200 NVL", 60e12, 835e12 / 2, 4.8e12)),
    (("h200",), Peak("H200 SXM", 67e12, 989e12 / 2, 4.8e12)),
    (("h100", "nvl"), Peak("H100 NVL", 60e12, 835e12 / 2, 3.9e12)),
    (("h100", "pcie"), Peak("H100 PCIe", 51e12, 756e12 / 2, 2.0e12)),
    (("h100",), Peak("H100 SXM", 67e12, 989e12 / 2, 3.35e12)),
)


def peak_for(device_name: str | None) -> Peak | None:
    """The datasheet peaks of the GPU called ``device_name`` (as CUDA names it), or None for one not in the table."""
    name = (device_name or "").lower()
    for fragments, peak in PEAKS:
        if all(fragment in name for fragment in fragments):
            return peak
    return None
