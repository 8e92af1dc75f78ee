#!/bin/bash
# One prepared research window on a lent GPU: a study of the paper's CapsNet on the full Fashion-MNIST
# that finishes inside the call, its folder packed (no checkpoints) into OUT/window-W.tar.gz.
#   A  gradient-modes: routing1, routing3-full, routing3-detach; 10 epochs x 3 seeds (about 8 minutes on
#      an H200 at 4.4 s an epoch)
#   B  paper-accuracy: the paper's model with the data set's 2-pixel shifts; EPOCHS (default 30) x SEEDS
#      (default 3); SEED_LIST=0 EPOCHS=50 trains one seed for 50 epochs in one call
#   C  routing-algorithms: each configuration's step time first (one line each,
#      routing_step_times.py), then the study with as many epochs as fit in MINUTES
# Usage: bash benchmarks/studies/gpu_window.sh A|B|C OUT [DATA_DIR]
#   DATA_DIR: where fashion-mnist/ lies (default: the loader's own search, /usr/share/datasets included)
#   DEVICE (default cuda), SEEDS, SEED_LIST, EPOCHS, MINUTES (C's study budget, default 8),
#   RUNS_PER_DEVICE (default 1: one full-model run fills an H200), DATASET (default fashion-mnist),
#   EXTRA (options for every run: the CPU tests give the reduced model and a tiny data set here).
# It prints what it ran and how long each run took; exit status: the study's (0 when it finished).
set -u
WINDOW=${1:?usage: gpu_window.sh A|B|C OUT [DATA_DIR]}
OUT=${2:?usage: gpu_window.sh A|B|C OUT [DATA_DIR]}
DATA_DIR=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
DEVICE=${DEVICE:-cuda}
read -r -a extra <<< "${EXTRA:-}"
data=(--dataset "${DATASET:-fashion-mnist}")
[ -n "$DATA_DIR" ] && data+=(--data-dir "$DATA_DIR")
case "$WINDOW" in
    A) study=gradient-modes; epochs=${EPOCHS:-10} ;;
    B) study=paper-accuracy; epochs=${EPOCHS:-30} ;;
    C) study=routing-algorithms; epochs= ;;
    *) echo "gpu_window.sh: the window is A, B or C, got $WINDOW" >&2; exit 2 ;;
esac
mkdir -p "$OUT" || exit 2
started=$(date +%s)
if [ "$WINDOW" = C ]; then
    python "$HERE/routing_step_times.py" --device "$DEVICE" --seeds "${SEEDS:-3}" --minutes "${MINUTES:-8}" \
        --json "$OUT/step_times.json" ${PROBE_IMAGES:+--probe-images "$PROBE_IMAGES"} \
        ${TRAIN_IMAGES:+--train-images "$TRAIN_IMAGES"} ${TEST_IMAGES:+--test-images "$TEST_IMAGES"} \
        -- "${data[@]}" "${extra[@]}" || exit 1
    epochs=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['epochs'])" "$OUT/step_times.json")
fi
seeds=(--seeds "${SEEDS:-3}")
[ -n "${SEED_LIST:-}" ] && seeds=(--seed-list "$SEED_LIST")
command=(study run "$study" --out "$OUT/$study" --epochs "$epochs" "${seeds[@]}" "${data[@]}" --device "$DEVICE"
         --no-progress "${extra[@]}")
case "$DEVICE" in cuda*) command+=(--runs-per-device "${RUNS_PER_DEVICE:-1}") ;; esac
[ -f "$OUT/$study/study.json" ] && command+=(--resume)
echo "window $WINDOW: tinygrad-caps ${command[*]}"
python -m tinygrad_caps.models.cli "${command[@]}" > "$OUT/$study.log" 2>&1
status=$?
tail -n 25 "$OUT/$study.log"
echo "window $WINDOW: exit $status after $(( $(date +%s) - started )) s; each run's training time:"
python - "$OUT/$study" <<'EOF'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
for metrics in sorted(folder.glob("runs/*/seed-*/metrics.jsonl")):
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    if lines:
        seconds = sum(line["seconds"] for line in lines)
        print(f"  {metrics.parent.relative_to(folder / 'runs')}: {len(lines)} epochs, {seconds:.1f} s, "
              f"test accuracy {lines[-1]['test_accuracy']:.4f}")
EOF
kept=()
for name in "$study" "$study.log" step_times.json; do [ -e "$OUT/$name" ] && kept+=("$name"); done
tar -czf "$OUT/window-$WINDOW.tar.gz" -C "$OUT" --exclude=checkpoints --exclude='*.npz' --exclude='*.lock' "${kept[@]}"
echo "packed: $OUT/window-$WINDOW.tar.gz ($(du -h "$OUT/window-$WINDOW.tar.gz" | cut -f1))"
exit $status
