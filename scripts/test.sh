#!/usr/bin/env bash
# Install the project with its development extras into .venv and run the whole test suite.
# This is the README's second command and exactly what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/venv.sh "dev"
bash scripts/native.sh  # the native KServe front end, tested beside the python one

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy services spark_client udfserve benchmarks

set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
