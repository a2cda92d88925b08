#!/usr/bin/env bash
# The one test command: makes or reuses .venv, installs torch's CPU build when
# torch is missing (a bare `torch` requirement would pull a multi-GB CUDA build),
# installs the package with its test extras, checks the code (ruff's lint and
# format, mypy's types), runs the suite.
#
# The suite runs in PYTEST_WORKERS processes (pytest-xdist, default 2: CI's two
# cores), each with one torch/OpenMP thread so the workers do not fight over the
# cores. Each test file goes whole to whichever worker is free (its module
# fixtures are built once), the files in collected order, which puts the files
# with the longest `slow` tests first (tests/conftest.py), so they never finish
# last. `bash tools/test.sh -n 0` runs in this process; `-m "not slow"` is the
# quick loop.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
pip install -q -e ".[test]"
ruff check dflash_chat tests tools
ruff format --check dflash_chat tests tools
mypy  # the package, as [tool.mypy] in pyproject.toml says
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
