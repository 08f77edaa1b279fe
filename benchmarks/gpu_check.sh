#!/usr/bin/env bash
# GPU check for radixgen's kernels, from a fresh copy of the repository.
#
#   bash benchmarks/gpu_check.sh          (BUDGET_S=540 by default, see below)
#
# 1. a venv (.venv-gpu, with --system-site-packages so a preinstalled torch/triton is used);
#    torch and triton are pip-installed only when `import torch, triton` fails (the GPU machine
#    may have no network: then this step fails and says so);
# 2. radixgen installed editable without dependencies (or, where that fails offline, a tree of
#    symlinks on PYTHONPATH); if the full package cannot import (its tokenizer/server
#    dependencies missing), kernel tests and benchmarks use a shim holding only radixgen.kernels;
# 3. pytest tests/kernels with TRITON_INTERPRET unset: the Triton kernels compile for the GPU
#    (the LoRA segment matmul of kernels/lora.py among them);
# 4. the CUDA graph test: the real capture and replay against the eager step (float32, and
#    bfloat16 with Q4_1 blocks);
# 5. python -m radixgen generate "..." end to end on the default model (its Q4_1/Q8_0 blocks on
#    the Triton matmul, decode steps from CUDA graphs);
# 6. benchmarks/bench_cuda_graph.py: decode ms a step, eager vs graphs, bfloat16 and Q4_1;
# 7. generate with the KV cache in 8 bits (the Triton store and attention kernels with scales);
# 8. benchmarks/bench_kernels.py: Triton vs reference vs the bandwidth bound;
# 9. speculative decoding (bench_spec.py).
# Every step runs even if an earlier one failed; a summary follows; the exit status is the
# number of failed steps. The whole run keeps within BUDGET_S seconds (default 540, under a
# 10-minute device call): a step gets at most what is left, and steps that no longer fit are
# listed as skipped, so the summary always prints. Steps run most important first.
set -uo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
BASE_PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-gpu}
failures=0
summary=()

record() {  # record NAME STATUS
    summary+=("$(printf '%-28s %s' "$1" "$2")")
    if [ "$2" != "ok" ]; then failures=$((failures + 1)); fi
}

BUDGET_S=${BUDGET_S:-540}
SUMMARY_S=5  # kept for the summary

step() {  # step NAME TIMEOUT_S CMD...: run with a deadline, record ok / FAILED (rc) / SKIPPED
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - SUMMARY_S - SECONDS))
    if [ "$left" -lt 20 ]; then
        echo
        echo "=== $name: skipped, ${left}s of the ${BUDGET_S}s budget left"
        summary+=("$(printf '%-28s %s' "$name" "SKIPPED (budget)")")
        return
    fi
    if [ "$limit" -gt "$left" ]; then limit=$left; fi
    echo
    echo "=== $name ($(date +%T), limit ${limit}s)"
    local start=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    local took=$((SECONDS - start))
    if [ $rc -eq 0 ]; then record "$name" "ok"; else record "$name" "FAILED (rc=$rc, ${took}s)"; fi
    echo "=== $name: rc=$rc in ${took}s"
}

echo "=== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
    echo "nvidia-smi not available"
if [ -x "$VENV/bin/python" ] || "$BASE_PYTHON" -m venv --system-site-packages "$VENV"; then
    PY=$VENV/bin/python
else
    PY=$BASE_PYTHON
    echo "cannot create $VENV (python3-venv missing?); using $PY directly"
fi

if "$PY" -c 'import torch, triton' 2>/dev/null; then
    echo "torch and triton are preinstalled: not installing anything"
else
    echo "torch/triton missing: pip install torch triton (default CUDA builds; needs network)"
    step "pip install torch triton" 300 "$PY" -m pip install --quiet torch triton
fi
"$PY" - <<'EOF' || { echo "torch/triton still not importable; stopping"; exit 1; }
import torch, triton
cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, triton {triton.__version__}, CUDA available: {cuda}")
if cuda:
    print(f"device: {torch.cuda.get_device_name(0)}")
else:
    print("WARNING: no CUDA device - tests will run the CPU interpreter, benchmarks will skip")
EOF
if ! "$PY" -c 'import pytest' 2>/dev/null; then
    echo "pytest missing: pip install pytest (needs network)"
    "$PY" -m pip install --quiet pytest || echo "could not install pytest"
fi

# Python snippets below drop sys.path[0] (the current directory): from the repository root,
# ./radixgen (without its mapped kernels/ and grammar/) would shadow the importable package.
no_cwd='import sys; sys.path.pop(0)'

echo
echo "=== make radixgen importable"
PACKAGE_PATH=""
pip_log=$(mktemp)
if "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . >"$pip_log" 2>&1; then
    echo "editable install of radixgen: ok"
else
    tail -n 3 "$pip_log"
    PACKAGE_PATH=$(mktemp -d)
    mkdir "$PACKAGE_PATH/radixgen"
    for entry in radixgen/*; do ln -s "$PWD/$entry" "$PACKAGE_PATH/radixgen/"; done
    ln -s "$PWD/kernels" "$PACKAGE_PATH/radixgen/kernels"
    ln -s "$PWD/grammar" "$PACKAGE_PATH/radixgen/grammar"
    echo "editable install failed; using a symlinked package tree in $PACKAGE_PATH"
fi
KERNELS_PATH=$PACKAGE_PATH
if ! PYTHONPATH=$PACKAGE_PATH "$PY" -c "$no_cwd; import radixgen.kernels"; then
    KERNELS_PATH=$(mktemp -d)
    mkdir "$KERNELS_PATH/radixgen"
    : >"$KERNELS_PATH/radixgen/__init__.py"
    ln -s "$PWD/kernels" "$KERNELS_PATH/radixgen/kernels"
    echo "radixgen does not import (missing dependencies?); kernels run from $KERNELS_PATH"
fi

step "pytest tests/kernels" 200 env PYTHONPATH="$KERNELS_PATH" \
    "$PY" -c "$no_cwd; import pytest; sys.exit(pytest.main(sys.argv[1:]))" \
    tests/kernels -q -p no:cacheprovider --durations=5
step "pytest tests/test_cuda_graph.py" 120 env PYTHONPATH="$PACKAGE_PATH" \
    "$PY" -c "$no_cwd; import pytest; sys.exit(pytest.main(sys.argv[1:]))" \
    tests/test_cuda_graph.py -q -p no:cacheprovider -k "a_replayed_step"
step "radixgen generate (e2e)" 120 env PYTHONPATH="$PACKAGE_PATH" \
    "$PY" -c "$no_cwd; import runpy; sys.argv[0] = 'radixgen'; runpy.run_module('radixgen', run_name='__main__')" \
    generate "The capital of France is"
step "bench_cuda_graph.py (decode steps, eager vs graphs)" 90 env PYTHONPATH="$PACKAGE_PATH" \
    "$PY" benchmarks/bench_cuda_graph.py
step "bench_cuda_graph.py --quantization q4_1" 90 env PYTHONPATH="$PACKAGE_PATH" \
    "$PY" benchmarks/bench_cuda_graph.py --quantization q4_1
step "radixgen generate --kv-cache-dtype int8" 100 env PYTHONPATH="$PACKAGE_PATH" \
    "$PY" -c "$no_cwd; import runpy; sys.argv[0] = 'radixgen'; runpy.run_module('radixgen', run_name='__main__')" \
    generate --kv-cache-dtype int8 "The capital of France is"
step "bench_kernels.py" 100 env PYTHONPATH="$KERNELS_PATH" \
    "$PY" benchmarks/bench_kernels.py
step "bench_spec.py (speculative decoding, code, batch 1 and 8)" 120 env PYTHONPATH="$PACKAGE_PATH" \
    "$PY" benchmarks/bench_spec.py --workloads code --requests 4 --new-tokens 64 --repeats 1

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit "$failures"
