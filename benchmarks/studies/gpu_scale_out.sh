#!/bin/bash
# The GPU figures of a study's scale-out, in one call of about 8 minutes on a lent GPU:
#   1. runs per device: images/s of the whole GPU with 1, 2 and 4 runs of the paper's CapsNet (B=100,
#      captured step) on it (benchmarks/runs_per_device.py);
#   2. the paper-scale gradient-modes study: the full model on the full Fashion-MNIST, 3 seeds, K runs
#      at a time on the GPU, stopped by --max-minutes and continued by the next call (same OUT).
# Usage: bash benchmarks/studies/gpu_scale_out.sh OUT [DATA_DIR]
#   EPOCHS (default 5), RUNS_PER_DEVICE (default 3), MINUTES (study time this call, default 5).
set -u
OUT=${1:?usage: gpu_scale_out.sh OUT [DATA_DIR]}
DATA_DIR=${2:-data}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
if [ ! -f "$OUT/runs_per_device.json" ]; then
    python "$HERE/runs_per_device.py" --runs 1 2 4 --seconds 15 --setup-seconds 45 --json > "$OUT/runs_per_device.json" \
        || echo "runs_per_device.py failed" >&2
fi
study=(study run gradient-modes --out "$OUT/gradient-modes" --seeds 3 --epochs "${EPOCHS:-5}"
       --dataset fashion-mnist --data-dir "$DATA_DIR" --device cuda --runs-per-device "${RUNS_PER_DEVICE:-3}"
       --no-progress --max-minutes "${MINUTES:-5}")
[ -f "$OUT/gradient-modes/study.json" ] && study+=(--resume)
python -m tinygrad_caps.models.cli "${study[@]}" > "$OUT/gradient-modes.log" 2>&1
status=$?
tail -n 30 "$OUT/gradient-modes.log"
if [ $status -eq 75 ]; then
    echo "the study continues: run this script again with the same OUT"
    exit 0
fi
exit $status
