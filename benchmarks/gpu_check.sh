#!/usr/bin/env bash
# Everything that needs a GPU, in one run that cannot pass vacuously (budget: 8 minutes on an
# H100, CuPy's first compile included). Fails when there is no GPU, when any GPU test fails or is
# skipped, when compute-sanitizer (memcheck, racecheck) reports anything in the kernel self-test,
# or when a benchmark fails. Logs and one gpu_summary.json go to OUTDIR.
#   bash benchmarks/gpu_check.sh [OUTDIR]      (default $OUT if set, else /tmp/tinygrad-caps-gpu-check)
# The GPU machine has no network: the project is installed without dependencies from its image.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-${OUT:-/tmp/tinygrad-caps-gpu-check}}
out=$(mkdir -p "$target" && cd "$target" && pwd)
py=${PYTHON:-python3}
started=$(date +%s)
export PYTHONUNBUFFERED=1

# run NAME SECONDS COMMAND...: the command's output goes to the terminal and to OUTDIR/NAME.log
run() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
}

run install 60 "$py" -m pip install --no-deps --no-build-isolation -e .

run versions 60 "$py" - "$out/versions.json" <<'PY'
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

# The GPU tests: under TINYGRAD_CAPS_REQUIRE_GPU=1 a gpu test that cannot use the GPU fails.
run gpu-tests 150 env TINYGRAD_CAPS_REQUIRE_GPU=1 "$py" -m pytest -q -m "$marker" -rs tests --junitxml "$out/gpu-tests.xml"
"$py" - "$out/gpu-tests.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
suites = ET.parse(sys.argv[1]).getroot()
suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
print(f"gpu tests: {counts}")
if counts["tests"] == 0 or counts["skipped"] or counts["failures"] or counts["errors"]:
    sys.exit("the GPU tests ran nothing, skipped some, or failed")
PY

# compute-sanitizer: on PATH, in a CUDA toolkit, or from the nvidia-cuda-sanitizer-api wheel
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
    /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)
if [ -z "$sanitizer" ]; then
    sanitizer=$("$py" -c 'import glob, site; print(next(iter(sorted(p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/cu*/compute-sanitizer/compute-sanitizer") + glob.glob(d + "/nvidia/cuda_sanitizer_api/compute-sanitizer/compute-sanitizer"))), ""))')
fi
if [ -z "$sanitizer" ]; then
    echo "compute-sanitizer not found (PATH, /usr/local/cuda*, the nvidia-cuda-sanitizer-api wheel)"
    exit 4
fi
echo "compute-sanitizer: $sanitizer"
for tool in memcheck racecheck; do
    run "sanitizer-$tool" 75 "$sanitizer" --tool "$tool" --error-exitcode 9 --print-limit 20 \
        "$py" -m tinygrad_caps.kernels.selftest --small --no-pool
done

run selftest 60 "$py" -m tinygrad_caps.kernels.selftest
(cd benchmarks && run routing-speed 75 "$py" routing_speed.py --impl cupy raw fused torch --repeat 10 --json)
(cd benchmarks && run train-step-cuda 60 "$py" train_step.py --device cuda --batch 32 100 --repeat 5 --json)

elapsed=$(( $(date +%s) - started ))
"$py" - "$out" "$elapsed" <<'PY'
import datetime, json, pathlib, sys
out, elapsed = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def json_tail(name):
    text = (out / f"{name}.log").read_text()
    return json.loads(text[0 if text.startswith("{") else text.index("\n{") + 1:])
summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "seconds": elapsed, "versions": json.loads((out / "versions.json").read_text()),
           "gpu_tests": (out / "gpu-tests.log").read_text().strip().splitlines()[-1],
           "sanitizers": {tool: (out / f"sanitizer-{tool}.log").read_text().strip().splitlines()[-1]
                          for tool in ("memcheck", "racecheck")},
           "selftest": (out / "selftest.log").read_text().strip().splitlines()[-1],
           "routing_speed": json_tail("routing-speed"), "train_step_cuda": json_tail("train-step-cuda")}
(out / "gpu_summary.json").write_text(json.dumps(summary, indent=2))
print(f"gpu_check passed in {elapsed} s; summary in {out / 'gpu_summary.json'}")
if elapsed > 480:
    sys.exit(f"gpu_check took {elapsed} s, over its 8-minute budget")
PY
