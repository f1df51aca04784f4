#!/usr/bin/env bash
# Install udfserve into .venv and run the end-to-end demo: the README's first command.
# Extra arguments go to `udfserve demo` (see `udfserve demo --help`), e.g. --rows 200000.
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
.venv/bin/python -m pip install --quiet -e '.[server,spark,fallback]'
exec .venv/bin/udfserve demo "$@"
