#!/usr/bin/env bash
# The one test command: makes or reuses .venv, installs torch's CPU build when
# torch is missing (a bare `torch` requirement would pull a multi-GB CUDA build),
# installs the package with its test extras, runs the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
pip install -q -e ".[test]"
exec python -m pytest -q "$@"
