#!/usr/bin/env bash
# Install udfserve into .venv and run the end-to-end demo: the README's first command.
# Extra arguments go to `udfserve demo` (see `udfserve demo --help`), e.g. --rows 200000.
set -euo pipefail
cd "$(dirname "$0")/.."

# The demo's example models are TensorFlow's: its server and its executors' CPU fallback both use the
# tensorflow extra.
source scripts/venv.sh "server,tensorflow,spark"
exec .venv/bin/udfserve demo "$@"
