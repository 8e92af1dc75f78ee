#!/usr/bin/env bash
# Everything that needs a GPU, in one short run (for a lent H100/H200): the GPU tests, then the
# routing and training-step benchmarks on CUDA. Copy the printed figures into RESULTS.md.
#   bash benchmarks/gpu_check.sh [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-results}
mkdir -p "$out"
python -m pip install -q -e ".[dev,cuda]" 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python -m pytest -q -m gpu tests 2>&1 | tail -15 | tee "$out/gpu-tests.txt"
(cd benchmarks && python routing_speed.py --repeat 20) 2>&1 | tee "$out/routing-speed.txt"
(cd benchmarks && python train_step.py --device cuda --repeat 10) 2>&1 | tee "$out/train-step-cuda.txt"
