#!/usr/bin/env bash
# Install udfserve into .venv and run the end-to-end demo: the README's first command.
# Extra arguments go to `udfserve demo` (see `udfserve demo --help`), e.g. --rows 200000.
set -euo pipefail
cd "$(dirname "$0")/.."

# The server extra brings TensorFlow, which the CPU fallback of the demo's executors uses too.
source scripts/venv.sh "server,spark"
exec .venv/bin/udfserve demo "$@"
