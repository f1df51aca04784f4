#!/usr/bin/env bash
# Run the whole test suite (scripts/test.sh) on a busy machine: CPU burners keep every core busy
# for the whole run, as other jobs do on a shared CI machine. The suite must pass this way.
#
#   bash scripts/test_under_load.sh                  # two runs in a row, 2 burners per core
#   bash scripts/test_under_load.sh --runs 1 -x      # one run; later arguments go to pytest
#   UDFSERVE_LOAD_BURNERS=8 bash scripts/test_under_load.sh
#
# Each run's outcome, wall time and the load average seen during it are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=2
if [ "${1:-}" = "--runs" ]; then
  runs="$2"
  shift 2
fi
burners="${UDFSERVE_LOAD_BURNERS:-$((2 * $(nproc)))}"

burner_pids=()
stop_burners() {
  if [ "${#burner_pids[@]}" -gt 0 ]; then
    kill "${burner_pids[@]}" 2>/dev/null || true
    wait "${burner_pids[@]}" 2>/dev/null || true
    burner_pids=()
  fi
}
trap stop_burners EXIT
trap 'exit 130' INT TERM

# Busy loops at normal priority: they compete with the tests for every core.
for _ in $(seq "$burners"); do
  python3 -c 'while True: pass' &
  burner_pids+=("$!")
done
echo "test_under_load: $burners CPU burners on $(nproc) cores; $runs run(s) of scripts/test.sh $*" >&2

summary=()
status=0
for run in $(seq "$runs"); do
  started=$(date +%s)
  set +e
  bash scripts/test.sh "$@"
  run_status=$?
  set -e
  seconds=$(($(date +%s) - started))
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  summary+=("run $run: exit $run_status in $((seconds / 60)) min $((seconds % 60)) s (load average at the end: $load)")
  if [ "$run_status" -ne 0 ]; then
    status=$run_status
    break
  fi
done
stop_burners
printf 'test_under_load: %s\n' "${summary[@]}" >&2
exit "$status"
