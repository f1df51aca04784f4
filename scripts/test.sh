#!/usr/bin/env bash
# Install the project with its development extras into .venv and run the whole test suite.
# This is the README's second command and exactly what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/venv.sh "dev"
bash scripts/native.sh  # the native KServe front end, tested beside the python one

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy follows no import hook, so it checks a tree of links where each folder sits under the package
# name it installs as (services/ as udfserve/services; scripts/source_tree.py)
typecheck_tree="$(.venv/bin/python scripts/source_tree.py . build/typecheck)"
(cd "$typecheck_tree" && "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" udfserve benchmarks)

# Test modules run in parallel worker processes, a module wholly in one worker (its module-scoped
# servers, Spark workers and fixtures stay together), handed out in the order tests/conftest.py
# sorts them (--no-loadscope-reorder: the Spark Connect modules last). Most of a test's time is
# spent starting processes (servers, Spark, imports) and waiting for them, so workers beyond the
# cores still pay: UDFSERVE_TEST_WORKERS sets how many (0: one process, no workers); arguments
# after it win.
set +e
.venv/bin/python -m pytest -n "${UDFSERVE_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
