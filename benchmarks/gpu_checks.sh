#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one command, each step under its own time limit,
# logs to a folder. Meant for a GPU machine with 16 CPU cores; the whole run is planned to
# finish in under 8 minutes on an H100/H200.
#
#   bash benchmarks/gpu_checks.sh [LOG_DIR]          (default: gpu-logs/)
#   GPU_CHECKS=tests,optable bash benchmarks/gpu_checks.sh      (a subset of the steps)
#
# Steps: tests (the GPU test files), optable (the op table in cuda mode, 16 pytest-xdist
# workers), fuzz (the differential fuzzer, which adds CUDA where a GPU is present),
# dp (data parallel on the GPU: mpiexec -n 2 sharing one GPU), bench
# (benchmarks/train_step_cuda.py), gpt (benchmarks/gpt_cuda.py: the charlm step, fp32 and
# bf16), thresholds (benchmarks/cuda_thresholds.py).
#
# A machine without pycuda/cffi/beartype (our GPU machines: Python 3.12, no network) can
# take them as wheels: copy ../shared/gpu/wheels/*.whl into .gpu-wheels/ (or point
# $GPU_WHEELS at a folder); they are installed into a temporary folder, nothing else changes.
# The dp step uses the machine's MPI (mpiexec and an mpi4py built for it; Open MPI there).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-gpu-logs}
mkdir -p "$LOG"
STEPS=${GPU_CHECKS:-tests,optable,fuzz,dp,bench,gpt,thresholds}
PY=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.gpu-wheels}
export PYTHONUNBUFFERED=1

if ! $PY -c "import pycuda, cffi, beartype" 2>/dev/null && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    site=$(mktemp -d)
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl \
        || { echo "could not install the wheels in $WHEELS"; exit 2; }
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d)}
# Open MPI refuses to start as root unless told (our GPU machines run commands as root)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

summary=()
run() {  # run NAME SECONDS COMMAND...: one step, its log, its exit status in the summary
    local name=$1 limit=$2
    shift 2
    case ",$STEPS," in *",$name,"*) ;; *) return 0 ;; esac
    local start=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee "$LOG/$name.log"
    timeout --kill-after=10 "$limit" "$@" >>"$LOG/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$LOG/$name.log"
    summary+=("$(printf '%-11s exit %-3s %4ss' "$name" "$rc" "$((SECONDS - start))")")
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\))' ; grep -o -m1 -w 'avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    $PY -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
    $PY -c "import pycuda.driver as d; d.init(); print('pycuda sees', d.Device(0).name())"
    $PY -c "from shapegrad.backends.cuda.toolchain import cublas_library, nvcc; print('nvcc', nvcc(), 'cublas', cublas_library())"
} 2>&1 | tee "$LOG/machine.log"

PYTEST=($PY -m pytest -q -p no:cacheprovider -o addopts=)
run tests 150 "${PYTEST[@]}" -n 4 tests/test_cuda_build.py tests/test_cuda_codegen.py tests/test_cuda_gpu.py tests/test_bfloat16.py tests/test_integer_minmax.py -m "not slow" -rs
run optable 150 "${PYTEST[@]}" -n 16 tests/test_ops.py -k cuda
run fuzz 120 "${PYTEST[@]}" -n 8 tests/test_fuzz.py
run dp 120 "${PYTEST[@]}" tests/test_distributed.py -k gpu -rs
run bench 150 $PY benchmarks/train_step_cuda.py
run gpt 150 $PY benchmarks/gpt_cuda.py --rounds ${GPT_ROUNDS:-5}
run thresholds 60 $PY benchmarks/cuda_thresholds.py

echo "== summary (logs in $LOG)"
printf '%s\n' "${summary[@]}" | tee "$LOG/summary.log"
