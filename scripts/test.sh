#!/usr/bin/env bash
# Install the project with its development extras into .venv and run the whole test suite.
# This is the README's second command and exactly what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Spark starts its Python workers and its launcher scripts with PYSPARK_PYTHON, else the first
# python3 on PATH: both must be this environment's interpreter.
export VIRTUAL_ENV="$PWD/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export PYSPARK_PYTHON="$VIRTUAL_ENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VIRTUAL_ENV/bin/python"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'

.venv/bin/ruff check .
.venv/bin/ruff format --check .

set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
