#!/usr/bin/env bash
# The one GPU script for a lent CUDA machine: installs the carried wheels (.whl, see README's
# Development section), then in order of value: the kernel check (it also fills Triton's cache in
# parallel), the 27B synthetic benchmark (the decode path against the bandwidth floor; the vision
# tower at full depth on a 1024x768 image beside the prefill of the same prompt), the CUDA
# tests, the 35B-A3B benchmark, Qwen3.8-27B with its DFlash2 drafter and the bf16 comparison with
# transformers. JSON and logs go to $OUT.
# Each step has its own time limit (seconds, overridable: GPU_CHECK_S=... etc.).
# The device image lacks a few of our dependencies: fetch their wheels into .whl/ first (git ignores it)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     gguf platformdirs tomlkit textual mdit-py-plugins linkify-it-py uc-micro-py
# and send .whl to the GPU machine with the checkout (git ignores it, so name it to be copied).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
step() { local name=$1 limit=$2; shift 2; echo "=== $name"; timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"; echo "=== $name rc=${PIPESTATUS[0]}"; }
bench() { python3 -m dflash_chat.cli bench --device cuda --save "$OUT" "$@"; }
step gpu_check "${GPU_CHECK_S:-120}" python3 tools/gpu_check.py --json "$OUT/gpu_check.json"
step bench_27b "${BENCH_S:-150}" bench --synthetic qwen3.6-27b --tokens 64 --image 1024x768
step cuda_tests "${CUDA_TESTS_S:-60}" python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/engine
step bench_35b "${BENCH_MOE_S:-60}" bench --synthetic qwen3.6-35b-a3b --tokens 64
step bench_38 "${BENCH_38_S:-90}" bench --synthetic qwen3.8-27b --tokens 64
step bench_bf16 "${BENCH_HF_S:-60}" bench --synthetic qwen3.6-27b --quant bf16 --layers 16 --tokens 32 --vs-transformers
