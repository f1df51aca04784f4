#!/usr/bin/env bash
# Every GPU path of udfserve run once, with a table of figures and a verdict for each
# (benchmarks/gpu_check; docs/deployment.md, "Verified on a GPU").
#
#   bash scripts/gpu_check.sh --build-wheelhouse   # here, with a network: build/gpu-wheelhouse
#   bash scripts/gpu_check.sh [--output DIR]       # on the GPU machine, no network, at most 8 minutes
#   bash scripts/gpu_check.sh --device cpu         # the dry run, on any machine (the test suite runs it)
#
# Nothing is installed from a network when it runs: the packages udfserve needs and the machine
# lacks come from the wheelhouse, unpacked into build/gpu-check/site, and udfserve itself runs from
# this source tree (scripts/source_tree.py) with the machine's own torch. Other arguments go to
# `python -m benchmarks.gpu_check` (--rows, --heavy-rows, --only). PYTHON picks the interpreter
# (default python3); GPU_CHECK_TIMEOUT_S bounds the run (default 480); GPU_CHECK_WHEELHOUSE names
# another wheelhouse than build/gpu-wheelhouse.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
python="${PYTHON:-python3}"
wheelhouse="${GPU_CHECK_WHEELHOUSE:-$root/build/gpu-wheelhouse}"

if [ "${1:-}" = "--build-wheelhouse" ]; then
  "$python" -m benchmarks.gpu_check.wheelhouse build "$wheelhouse"
  exit 0
fi

output="$root/build/gpu-check/results"
arguments=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --output) output="$(realpath -m "$2")"; shift 2 ;;
    --output=*) output="$(realpath -m "${1#--output=}")"; shift ;;
    *) arguments+=("$1"); shift ;;
  esac
done

# udfserve from this checkout: services/ and spark_client/ linked where their package names say
tree="$("$python" scripts/source_tree.py "$root" "$root/build/gpu-check/tree")"
path="$tree"
# the wheelhouse's packages first, where it was built for this interpreter (CPython 3.12)
if compgen -G "$wheelhouse/*.whl" >/dev/null &&
  "$python" -m benchmarks.gpu_check.wheelhouse unpack "$wheelhouse" "$root/build/gpu-check/site"; then
  path="$tree:$root/build/gpu-check/site"
fi
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"

# run from the linked tree: `python -m` puts the working folder first on sys.path, and this
# checkout's own udfserve/ folder lacks the services and spark_client packages
cd "$tree"
if ! "$python" -m benchmarks.gpu_check.wheelhouse check; then
  echo "expected every module above to import; build the wheelhouse with a network first:" \
    "bash scripts/gpu_check.sh --build-wheelhouse" >&2
  exit 3
fi
exec timeout --signal=TERM --kill-after=30 "${GPU_CHECK_TIMEOUT_S:-480}" \
  "$python" -m benchmarks.gpu_check --output "$output" ${arguments[@]+"${arguments[@]}"}
