#!/usr/bin/env bash
# The one test command: makes or reuses .venv, installs torch's CPU build when
# torch is missing (a bare `torch` requirement would pull a multi-GB CUDA build),
# installs the package with its test extras, checks the code (ruff's lint and
# format, mypy's types, the latter beside the suite), runs the suite.
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
# The coding agents tests/serve/test_agents.py drives, pinned, from npm into a cache folder (when npm is here;
# without them those tests skip): installed once per set of pins, in the background beside the checks and the
# tests (a clean machine takes a minute or more); the agents' tests then run last and wait for it
# (DFLASH_CHAT_AGENTS_STATUS, set only then, names the file that says it ended).
AGENTS="@anthropic-ai/claude-code@2.1.328 @openai/codex@0.169.0 opencode-ai@1.18.33"
AGENTS_DIR="${DFLASH_CHAT_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dflash-chat-test-agents}"
AGENTS_PID=""
if command -v npm >/dev/null && command -v node >/dev/null; then
  if [ "$(cat "$AGENTS_DIR/pins" 2>/dev/null)" != "$AGENTS" ]; then
    mkdir -p "$AGENTS_DIR"
    export DFLASH_CHAT_AGENTS_STATUS="$AGENTS_DIR/install-status"
    rm -f "$DFLASH_CHAT_AGENTS_STATUS"
    (
      # shellcheck disable=SC2086 # the pins are words
      if timeout 300 npm install --prefix "$AGENTS_DIR" --no-audit --no-fund --loglevel=error $AGENTS >/dev/null; then
        echo "$AGENTS" > "$AGENTS_DIR/pins"
        echo installed > "$DFLASH_CHAT_AGENTS_STATUS"
      else
        echo "note: the coding agents did not install from npm; their tests skip" >&2
        echo failed > "$DFLASH_CHAT_AGENTS_STATUS"
      fi
    ) &
    AGENTS_PID=$!
  fi
  export DFLASH_CHAT_AGENTS_BIN="$AGENTS_DIR/node_modules/.bin"
fi
ruff check dflash_chat tests tools
ruff format --check dflash_chat tests tools
# mypy (the package, as [tool.mypy] in pyproject.toml says) runs beside the tests: it takes about 40 s from a
# clean clone, on one core, which the tests leave idle part of the time; its failure fails the command.
MYPY_LOG="$(mktemp)"
mypy > "$MYPY_LOG" 2>&1 &
MYPY_PID=$!
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
status=0
python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@" || status=$?
if wait "$MYPY_PID"; then
  tail -n 1 "$MYPY_LOG"
else
  cat "$MYPY_LOG"
  echo "mypy found type errors (above)" >&2
  status=1
fi
rm -f "$MYPY_LOG"
[ -z "$AGENTS_PID" ] || wait "$AGENTS_PID" || true  # a run that left the agents out: the next one has them
exit "$status"
