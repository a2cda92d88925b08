#!/usr/bin/env bash
# The one GPU script for a lent CUDA machine (see README, Development): installs the carried wheels,
# runs the CUDA tests, the kernel check and the engine benchmarks, and leaves JSON under $OUT.
#   run: bash tools/gpu_run.sh   (carry .whl; wheels from `pip download` as the device README says)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git rev-parse HEAD 2>/dev/null > "$OUT/commit.txt" || true
step() { local name=$1 limit=$2; shift 2; echo "=== $name"; timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"; echo "=== $name rc=${PIPESTATUS[0]}"; }
step gpu_check "${GPU_CHECK_S:-150}" python3 tools/gpu_check.py ${GPU_CHECK_ARGS:---no-sweep}
step cuda_tests "${CUDA_TESTS_S:-90}" python3 -m pytest -q -x -p no:cacheprovider -k cuda tests/engine
step bench "${BENCH_S:-120}" python3 -m dflash_chat.cli bench --device cuda --dtype bfloat16 ${BENCH_ARGS:---layers 16 --hidden 2048 --prompts 2 --tokens 64 --vs-transformers} --json
step bench_moe "${BENCH_S:-120}" python3 -m dflash_chat.cli bench --device cuda --dtype bfloat16 --arch qwen3_5_moe --layers 8 --hidden 1024 --prompts 2 --tokens 64 --json
