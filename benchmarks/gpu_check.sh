#!/usr/bin/env bash
# Everything that needs a GPU, in one run that cannot pass vacuously. Exits non-zero when there is no
# GPU, when any GPU test fails or is skipped, when compute-sanitizer (memcheck, racecheck) is missing
# or reports anything in the kernel self-test, when a benchmark fails, or when the run goes over its
# budget.
#   bash benchmarks/gpu_check.sh [OUTDIR]      (default $OUT if set, else /tmp/tinygrad-caps-gpu-check)
# GPU_CHECK_PROFILE picks its size (GPU_CHECK_BUDGET_S overrides the budget):
#   quick  at most 3 minutes: the kernel self-test, the GPU tests, routing_speed.py, our training step
#          against PyTorch eager and its CUDA graph at B=100 at both precisions, the history compare;
#   full   (the default) at most 8 minutes: all of that at B=32 and 100, torch.compile reduce-overhead,
#          the NCCL test, the first epoch cold and warm, compute-sanitizer and a Fashion-MNIST epoch.
# (torch.compile max-autotune is a call of its own: train_step.py's docstring.)
# Every run writes its figures to benchmarks/history/gpu/<date>-<gpu>.json (GPU_CHECK_HISTORY_DIR) and
# a copy beside the summary, and compares them with the newest earlier file of the same GPU model
# (compare_gpu_runs.py): the comparison is in the summary; a regression is flagged there, not failed.
# GPU time is scarce: after the GPU is found, a failing step is recorded and the next one runs,
# so one run gathers every figure and every failure; each step's time limit is cut to what is
# left of the budget. Logs, failed_steps.txt and one gpu_summary.json go to OUTDIR. With
# Fashion-MNIST's four files in data/fashion-mnist/ (ignored by git; carry it), a full epoch is
# timed last.
# GPU_CHECK_TORCH_COMPILE_S (default 180) is the time train_step.py gives torch.compile's compiles in
# all (its step's limit is that plus 150 s); what does not fit is skipped and says so in the table.
# GPU_CHECK_PACK=1 packs every log into OUTDIR/gpu_check_logs.tar.gz at the end, leaving beside it
# only gpu_summary.json and failed_steps.txt (for a machine that sends back only a few files).
# The GPU machine has no network: the project is installed without dependencies from its image.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${GPU_CHECK_PROFILE:-full}
case "$profile" in
    quick) default_budget=180 ;;
    full) default_budget=480 ;;
    *) echo "gpu_check.sh: GPU_CHECK_PROFILE must be quick or full, got '$profile'" >&2; exit 2 ;;
esac
target=${1:-${OUT:-/tmp/tinygrad-caps-gpu-check}}
out=$(mkdir -p "$target" && cd "$target" && pwd)
py=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET_S:-$default_budget}
history_dir=${GPU_CHECK_HISTORY_DIR:-benchmarks/history/gpu}
started=$(date +%s)
deadline=$((started + budget - 15))  # 15 s kept for the summary
export PYTHONUNBUFFERED=1
: > "$out/failed_steps.txt"

# failed WHY: records a failed step (subshells too, as the record is a file)
failed() {
    echo "== FAILED: $1"
    echo "$1" >> "$out/failed_steps.txt"
}

# run NAME SECONDS COMMAND...: the command's output goes to the terminal and to OUTDIR/NAME.log.
# A failure (or a timeout) is recorded in failed_steps.txt and returns 1; the script goes on.
run() {
    local name=$1 limit=$2 status=0
    shift 2
    local left=$((deadline - 10 - $(date +%s)))  # 10 s for timeout's SIGKILL grace
    if [ "$left" -lt "$limit" ]; then
        limit=$left
    fi
    if [ "$limit" -le 0 ]; then
        echo "not run: the ${budget}s budget is spent" > "$out/$name.log"
        failed "$name (not run: the budget is spent)"
        return 1
    fi
    echo "== $name (at most ${limit}s): $*"
    # SIGTERM first (training saves and stops at its next batch), SIGKILL 10 s later
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$out/$name.log" || status=$?
    if [ "$status" -ne 0 ]; then
        if [ "$status" -eq 124 ]; then
            failed "$name (timed out after ${limit}s)"
        else
            failed "$name (exit $status)"
        fi
        return 1
    fi
}

# Without the package or a GPU nothing else can run: these two end the check at once.
run install 60 "$py" -m pip install --no-deps --no-build-isolation -e . || exit 2

run versions 30 "$py" - "$out/versions.json" <<'PY' || exit 3
import json, platform, sys
import tinygrad_caps as tc
from tinygrad_caps.backend import _gpu_status

if not tc.gpu_available():
    print(f"no usable GPU: {_gpu_status()[1]}")
    sys.exit(3)
import cupy
device = cupy.cuda.Device()
props = cupy.cuda.runtime.getDeviceProperties(device.id)
def version(v):
    return f"{v // 1000}.{v % 1000 // 10}"
info = {"gpu": props["name"].decode(), "gpus": cupy.cuda.runtime.getDeviceCount(),
        "compute_capability": device.compute_capability, "memory_bytes": props["totalGlobalMem"],
        "driver": version(cupy.cuda.runtime.driverGetVersion()), "cuda_runtime": version(cupy.cuda.runtime.runtimeGetVersion()),
        "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion())), "cupy": cupy.__version__,
        "python": platform.python_version(), "tinygrad_caps": tc.__version__ if hasattr(tc, "__version__") else None}
try:
    from cupy.cuda import nccl
    info["nccl"] = nccl.get_version() if nccl.available else None  # e.g. 22707 for 2.27.7
except Exception as exc:  # noqa: BLE001  (reported, not fatal: only the NCCL tests need it)
    info["nccl"] = f"unavailable ({exc})"
try:
    import mpi4py
    info["mpi4py"] = mpi4py.__version__
except ImportError:
    info["mpi4py"] = None
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
except ImportError:
    info["torch"] = None
for key, value in info.items():
    print(f"{key:>18}: {value}")
json.dump(info, open(sys.argv[1], "w"), indent=2)
PY
gpus=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gpus"])' "$out/versions.json")
marker="gpu"
if [ "$gpus" -lt 2 ]; then
    marker="gpu and not multigpu"  # the two-GPU tests are left out (not skipped) on one GPU
fi

# Every kernel at CapsNet's sizes against NumPy first: the quickest sign that the kernels work.
run selftest 60 "$py" -m tinygrad_caps.kernels.checking.selftest || true

# The GPU tests: under TINYGRAD_CAPS_REQUIRE_GPU=1 a gpu test that cannot use the GPU fails. Only
# the files that hold gpu tests (in any folder under tests/) are collected: another file skipped
# as a whole (a module-level importorskip of an optional package) would count as a skip in the
# report. The NCCL tests (a process of their own under mpirun) run apart, so that a hang there
# cannot take the others' report with it.
gpu_test_files=$(grep -rl --include="test_*.py" "pytest.mark.gpu" tests | sort || true)
[ -n "$gpu_test_files" ] || failed "gpu-tests (no test file marks a test with pytest.mark.gpu)"
parts="main nccl"
[ "$profile" = full ] || parts="main"  # the NCCL test (a process under mpirun) runs in the full check
for part in $parts; do
    if [ "$part" = nccl ]; then
        name=gpu-tests-nccl select="nccl" limit=90
    else
        name=gpu-tests select="not nccl" limit=$([ "$profile" = full ] && echo 130 || echo 90)
    fi
    run "$name" "$limit" env TINYGRAD_CAPS_REQUIRE_GPU=1 "$py" -m pytest -q -p no:cacheprovider -m "$marker" \
        -k "$select" -rs $gpu_test_files --junitxml "$out/$name.xml" || true
    run "$name-counted" 15 "$py" - "$out/$name.xml" <<'PY' || true
import os, sys, xml.etree.ElementTree as ET
if not os.path.exists(sys.argv[1]):
    sys.exit("no test report: the test step ended (killed or timed out) before pytest wrote it")
suites = ET.parse(sys.argv[1]).getroot()
suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
print(f"gpu tests: {counts}")
if counts["tests"] == 0 or counts["skipped"] or counts["failures"] or counts["errors"]:
    sys.exit("the GPU tests ran nothing, skipped some, or failed")
PY
done

if [ "$profile" = full ]; then
    (cd benchmarks && run routing-speed 75 "$py" routing_speed.py --impl cupy raw fused torch --repeat 10 --json) || true
else
    (cd benchmarks && run routing-speed 45 "$py" routing_speed.py --impl cupy raw fused torch --repeat 5 --json) || true
fi
# ours eager and captured as a CUDA graph against PyTorch eager and captured (torch.cuda.CUDAGraph), and
# in the full check compiled (torch.compile reduce-overhead), at both matmul precisions; with each
# step's FLOPs and bytes against the GPU's peak and copy bandwidth, host and GPU time apart, and memory.
# Each variant's first steps, each (batch, precision) and each compile run in processes of their own
# (train_step.py --isolate): a variant that crashes costs its own cell. torch.compile gets
# GPU_CHECK_TORCH_COMPILE_S seconds in all (default 180); what does not fit is skipped with the reason,
# so the step ends within its limit with every other figure (gathered so far in train-step-partial.json).
compile_s=${GPU_CHECK_TORCH_COMPILE_S:-180}
if [ "$profile" = full ]; then
    (cd benchmarks && run train-step-cuda $((compile_s + 150)) "$py" train_step.py --device cuda --batch 32 100 \
        --repeat 5 --torch-variants eager graph compile-reduce-overhead --torch-compile-budget "$compile_s" \
        --partial-json "$out/train-step-partial.json" --json) || true
else
    (cd benchmarks && run train-step-cuda 75 "$py" train_step.py --device cuda --batch 100 --repeat 3 \
        --torch-variants eager graph --partial-json "$out/train-step-partial.json" --json) || true
fi
# a captured step must compute what the eager one does (train_step.py compares the weights after 10 steps)
run cuda-graph-equals-eager 15 "$py" - "$out/train-step-cuda.log" <<'PY' || true
import json, sys
text = open(sys.argv[1]).read()
try:
    rows = json.JSONDecoder().raw_decode(text, text.rfind("\n{") + 1)[0]["rows"]  # what follows the object is ignored
except (ValueError, KeyError) as exc:
    sys.exit(f"no train_step.py JSON to compare: {exc}")
differences = [(row.get("batch"), row.get("precision"), row.get("graph_max_rel_diff")) for row in rows]
print("captured vs eager weights after 10 steps (batch, precision, largest relative difference):", differences)
if not rows or any(d is None or d > 1e-5 for _, _, d in differences):
    sys.exit("a captured training step differs from the eager one (or was not measured)")
PY

if [ "$profile" = full ]; then
# The first epoch in new processes: CuPy's kernel cache empty with the first-launch warm-up off (as
# before), empty with it on, then warm (goal: cold <= 5 s at "highest"); the random images of the
# same shapes where Fashion-MNIST was not carried here
run first-epoch 120 "$py" benchmarks/first_epoch.py --device cuda --data-dir "${GPU_CHECK_DATA_DIR:-data}" --json || true

# compute-sanitizer: $COMPUTE_SANITIZER, on PATH, in a CUDA toolkit, or from the nvidia-cuda-sanitizer-api wheel
sanitizer=${COMPUTE_SANITIZER:-}
[ -n "$sanitizer" ] || sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
    /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)
if [ -z "$sanitizer" ]; then
    sanitizer=$("$py" -c 'import glob, site; print(next(iter(sorted(p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/cu*/compute-sanitizer/compute-sanitizer") + glob.glob(d + "/nvidia/cuda_sanitizer_api/compute-sanitizer/compute-sanitizer"))), ""))' || true)
fi
for tool in memcheck racecheck; do
    if [ -z "$sanitizer" ]; then
        echo "compute-sanitizer not found (PATH, /usr/local/cuda*, the nvidia-cuda-sanitizer-api wheel)" \
            | tee "$out/sanitizer-$tool.log"
        failed "sanitizer-$tool (compute-sanitizer not found)"
        continue
    fi
    run "sanitizer-$tool" 60 "$sanitizer" --tool "$tool" --error-exitcode 9 --print-limit 20 \
        "$py" -m tinygrad_caps.kernels.checking.selftest --small --no-pool || true
done

# One Fashion-MNIST epoch of the full model (60,000 images, B=100) on the GPU, when its four files
# were carried to this machine in DATA_DIR/fashion-mnist (GPU_CHECK_DATA_DIR, default data/, which
# git ignores): the machine has no network. Last, as it takes what is left of the budget.
data_dir=${GPU_CHECK_DATA_DIR:-data}
if ls "$data_dir"/fashion-mnist/train-images-idx3-ubyte* >/dev/null 2>&1; then
    # the run's checkpoints (about 100 MB) stay out of OUTDIR; its metrics line is kept
    epoch_run=$(mktemp -d)/run
    run epoch-fashion-mnist 180 "$py" -m tinygrad_caps.models.cli train --dataset fashion-mnist --data-dir "$data_dir" \
        --epochs 1 --batch-size 100 --limit-test 1000 --device cuda --no-progress --out "$epoch_run" || true
    cp "$epoch_run/metrics.jsonl" "$out/epoch-metrics.jsonl" 2>/dev/null || true
    rm -rf "$(dirname "$epoch_run")"
else
    echo "no Fashion-MNIST files in $data_dir/fashion-mnist: the epoch is not timed" | tee "$out/epoch-fashion-mnist.log"
fi
fi  # the full check's steps

elapsed=$(( $(date +%s) - started ))
status=0
"$py" - "$out" "$elapsed" "$budget" "$profile" <<'PY' || status=$?
import datetime, json, pathlib, sys
out, elapsed, budget, profile = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def last_line(name):
    path = out / f"{name}.log"
    lines = path.read_text().strip().splitlines() if path.exists() else []
    return lines[-1] if lines else None

def json_tail(name):
    """The JSON object a benchmark prints last, or why there is none."""
    path = out / f"{name}.log"
    text = path.read_text() if path.exists() else ""
    try:
        # the object starts a line; a line printed after it (a library's warning at exit) is ignored
        return json.JSONDecoder().raw_decode(text, text.rfind("\n{") + 1)[0]
    except ValueError as exc:
        return {"error": f"unreadable JSON output: {exc}"}

def epoch():
    """The Fashion-MNIST epoch's figures from its metrics.jsonl, or why there are none."""
    path = out / "epoch-metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    if not lines:  # no data, or the run was cut before its epoch ended
        return {"not_timed": last_line("epoch-fashion-mnist")}
    line = json.loads(lines[0])
    return {"train_seconds": round(line["seconds"], 2), "images_per_second": round(60000 / line["seconds"], 1),
            "train_accuracy": line["train_accuracy"], "test_accuracy_first_1000": line["test_accuracy"]}


failed = [line for line in (out / "failed_steps.txt").read_text().splitlines() if line]
if elapsed > budget:
    failed.append(f"the whole check took {elapsed} s, over its {budget} s budget")


def rounded(value, digits=3):
    return None if value is None else round(value, digits)


def step_against_best(row):
    """A train_step.py row's figures against PyTorch's fastest variant and the hardware (None where missing)."""
    variants, goal, memory, cost = (row.get(k) or {} for k in ("variants", "goal", "memory", "cost"))
    timed = {name: v for name, v in variants.items() if isinstance(v, dict) and v.get("s")}
    mib = lambda value: None if value is None else round(value / 2 ** 20, 1)  # noqa: E731
    ours = timed.get(goal.get("ours")) or {}
    return {"ms": {name: round(v["s"] * 1e3, 3) for name, v in timed.items()},
            "host_gpu_ms": {name: [rounded(v.get("host_s") and v["host_s"] * 1e3),
                                   rounded(v.get("gpu_s") and v["gpu_s"] * 1e3)] for name, v in timed.items()},
            "compile_s": {name: rounded(v.get("compile_s"), 1) for name, v in timed.items() if v.get("compile_s")},
            "skipped": {name: v["skipped"] for name, v in variants.items() if isinstance(v, dict) and "skipped" in v},
            "fastest_pytorch": goal.get("fastest_torch"), "ratio_to_fastest_pytorch": rounded(goal.get("ratio")),
            "goal_1x_met": goal.get("met"), "moonshot_0_8x_met": goal.get("moonshot_met"),
            "gflop_per_step": rounded(cost.get("gflop"), 2), "mb_per_step": rounded(cost.get("mb"), 1),
            "ours_fraction_of_peak": rounded(ours.get("fraction_of_peak")),
            "ours_fraction_of_copy_bandwidth": rounded(ours.get("fraction_of_copy_bandwidth")),
            "memory_mib": {"ours_eager_peak": mib(memory.get("ours_eager_peak_bytes")),
                           "ours_captured": mib(memory.get("ours_captured_bytes")),
                           "pytorch_eager_peak": mib(memory.get("torch_eager_peak_bytes")),
                           "pytorch_graph": mib(memory.get("torch_graph_bytes"))},
            "memory_captured_to_eager": rounded(memory.get("captured_to_eager")),
            "memory_goal_1_1x_met": memory.get("met")}


def figures(routing, step, epoch_figures):
    """The figures the GPU issue's targets name, read from the benchmarks' JSON (what is missing is left out)."""
    found = {}
    rows = [r for r in step.get("rows", []) if isinstance(r, dict) and "ours_s" in r]
    if rows:
        found["train_step_ms"] = [dict({"batch": r["batch"], "precision": r.get("precision"),
                                        "ours_eager": round(r["ours_s"] * 1e3, 2),
                                        "ours_captured": round(r["ours_graph_s"] * 1e3, 2) if "ours_graph_s" in r else None,
                                        "pytorch": round(r["torch_s"] * 1e3, 2) if "torch_s" in r else None,
                                        "ratio_to_pytorch": round(r["ratio"], 3) if "ratio" in r else None},
                                       **step_against_best(r)) for r in rows]
    passes = {(r.get("impl"), r.get("precision", "highest"), r.get("pass")): r.get("median_s")
              for r in routing.get("rows", []) if isinstance(r, dict)}
    ours, theirs = passes.get(("raw", "highest", "forward+backward")), passes.get(("torch-cuda", "highest", "forward+backward"))
    if ours and theirs:
        found["digitcaps_forward_backward_ms"] = {"ours": round(ours * 1e3, 3), "pytorch": round(theirs * 1e3, 3),
                                                  "ratio": round(ours / theirs, 3)}
    kernels = routing.get("raw_kernels", {})
    if kernels:
        found["kernel_fraction_of_copy_bandwidth"] = {name: round(k["fraction_of_copy_bandwidth"], 3)
                                                      for name, k in kernels.items()}
        found["kernel_variants"] = {name: f"{k['variant']} ({k['variant_how']})" for name, k in kernels.items()
                                    if "variant" in k}
        found["kernel_bandwidth_goals"] = {name: {"fraction": round(k["fraction_of_copy_bandwidth"], 3),
                                                  "goal": k["goal_fraction_of_copy_bandwidth"], "met": k["goal_met"]}
                                           for name, k in kernels.items() if "goal_met" in k}
    if routing.get("fused_forward_speedup"):
        found["fused_forward_speedup"] = routing["fused_forward_speedup"]
    if "train_seconds" in epoch_figures:
        found["epoch_seconds"] = epoch_figures["train_seconds"]
    first = json_tail("first-epoch")
    if first.get("rows"):
        found["first_epoch_seconds"] = {r["run"]: {"epoch": r["epoch_seconds"], "process": r["process_seconds"],
                                                   "new_cache_files": r["new_cache_files"]} for r in first["rows"]}
    return found


def train_step_json():
    """train_step.py's JSON, or what it wrote after its last finished stage where it was cut short."""
    found = json_tail("train-step-cuda")
    partial = out / "train-step-partial.json"
    if "rows" not in found and partial.exists():
        found = dict(json.loads(partial.read_text()), cut_short=found.get("error"))
    return found


epoch_figures = epoch()
step = train_step_json()
summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "profile": profile, "budget_s": budget, "seconds": elapsed, "passed": not failed, "failed_steps": failed,
           "versions": json.loads((out / "versions.json").read_text()),
           "selftest": last_line("selftest"), "gpu_tests": last_line("gpu-tests"),
           "gpu_tests_nccl": last_line("gpu-tests-nccl"),
           "sanitizers": {tool: last_line(f"sanitizer-{tool}") for tool in ("memcheck", "racecheck")},
           "routing_speed": json_tail("routing-speed"), "train_step_cuda": step,
           "first_epoch": json_tail("first-epoch"),
           "cuda_graph_equals_eager": last_line("cuda-graph-equals-eager"),
           "figures": figures(json_tail("routing-speed"), step, epoch_figures),
           "fashion_mnist_epoch": epoch_figures}
(out / "gpu_summary.json").write_text(json.dumps(summary, indent=2))
if failed:
    print(f"gpu_check FAILED after {elapsed} s: " + "; ".join(failed) + f" (summary in {out / 'gpu_summary.json'})",
          file=sys.stderr)
    sys.exit(1)
print(f"gpu_check passed in {elapsed} s; summary in {out / 'gpu_summary.json'}")
PY
# The run's figures into the GPU history, compared with the newest earlier run on the same GPU model
# (into the summary; a regression is flagged there and printed, the check's status is the steps')
"$py" benchmarks/gpu_history.py record "$out" --history-dir "$history_dir" 2>&1 | tee "$out/history.log" \
    || echo "== the GPU history could not be written (history.log)"
if [ "${GPU_CHECK_PACK:-0}" = 1 ]; then
    (cd "$out" && find . -maxdepth 1 -type f ! -name gpu_summary.json ! -name failed_steps.txt ! -name gpu_check_logs.tar.gz \
        ! -name 'history-*.json' -printf '%P\n' | sort | tar czf gpu_check_logs.tar.gz -T - && find . -maxdepth 1 -type f \
        ! -name gpu_summary.json ! -name failed_steps.txt ! -name gpu_check_logs.tar.gz ! -name 'history-*.json' -delete)
fi
exit "$status"
