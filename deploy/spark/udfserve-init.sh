#!/usr/bin/env bash
# Starts `udfserve node` on this machine, detached, for platforms whose init scripts run on every node
# of a cluster at its boot (a Databricks cluster init script, a Dataproc initialization action, an EMR
# bootstrap action) or as a Spark worker's start-up hook (deploy/cluster/node.yml, layout init-script).
#
#   udfserve-init.sh [start|stop|status]            start when no argument is given
#
#   start   starts the node unless one already runs in the runtime folder (the supervisor's lock,
#           <runtime dir>/node.lock, is held), in a session of its own, so that it outlives this
#           script and the boot step that ran it; its log goes to a file. Then waits until every
#           server of the node is ready, so that the executors started after it find them at their
#           first task; a node still loading after UDFSERVE_INIT_WAIT_S is left to finish (the
#           executors use the CPU fallback until it is ready). Starts are serialised: run it again,
#           or twice at once, and one node runs. Exits 1, with the end of the node's log, when the
#           node exits during its start (a bad setting, an unreadable repository).
#   stop    SIGTERM to the supervisor, which drains and stops its servers; whatever of the node's
#           process group still runs after UDFSERVE_INIT_STOP_S gets SIGKILL. Then nothing of it runs.
#   status  prints the supervisor's pid and exits 0 when a node runs in the runtime folder, else 1.
#
# Settings, from the environment. The node reads its own UDFSERVE_* settings (docs/node.md); those
# an init script usually sets:
#   UDFSERVE_MODEL_REPOSITORY   the repository every server loads: a mount every node shares (required)
#   UDFSERVE_RUNTIME_DIR        the runtime folder (default /tmp/udfserve-<uid>, the node's default);
#                               give the executors the same, they find the discovery file in it
#   UDFSERVE_DEVICES            auto (default: every GPU NVML finds, else the CPU), cpu, gpu:0,gpu:1
# and this script's own:
#   UDFSERVE_INIT_UDFSERVE      the udfserve command (default: `udfserve` on PATH)
#   UDFSERVE_INIT_PYTHON        a Python 3 that reads the discovery file (default: `python3` on PATH)
#   UDFSERVE_INIT_LOG           the node's log (default: <runtime dir>/logs/node.log, appended)
#   UDFSERVE_INIT_WAIT_S        seconds start waits for the node to be ready (default 600; 0: no wait)
#   UDFSERVE_INIT_STOP_S        seconds stop waits before SIGKILL (default 60)
#
# The node runs as the user that runs this script. Executors of another user must trust it
# (spark.udfserve.trustedNodeUids) and be able to open its sockets: see docs/deployment.md.
set -euo pipefail

ACTION=${1:-start}
RUNTIME=${UDFSERVE_RUNTIME_DIR:-/tmp/udfserve-$(id -u)}
UDFSERVE=${UDFSERVE_INIT_UDFSERVE:-udfserve}
PYTHON=${UDFSERVE_INIT_PYTHON:-python3}
LOG=${UDFSERVE_INIT_LOG:-$RUNTIME/logs/node.log}
WAIT_S=${UDFSERVE_INIT_WAIT_S:-600}
STOP_S=${UDFSERVE_INIT_STOP_S:-60}
DISCOVERY=${UDFSERVE_DISCOVERY_FILE:-$RUNTIME/discovery.json}

say() { echo "udfserve-init: $*"; }

# The supervisor holds an flock on node.lock while it runs (the kernel drops it when the process
# dies, however it dies) and writes its pid there.
node_running() { [ -e "$RUNTIME/node.lock" ] && ! flock -n "$RUNTIME/node.lock" true; }
supervisor_pid() { tr -dc '0-9' < "$RUNTIME/node.lock"; }

# 0 when the discovery file is fresh, written by the running supervisor, and lists every server
# ready; prints what it found otherwise.
node_ready() {
  "$PYTHON" - "$DISCOVERY" "$(supervisor_pid)" <<'EOF'
import json, sys, time
try:
    with open(sys.argv[1]) as handle:
        discovery = json.load(handle)
except (OSError, ValueError) as exc:
    print(f"no discovery file yet ({exc.__class__.__name__})")
    sys.exit(1)
servers = discovery.get("servers", [])
states = ", ".join(f"{s.get('device')} {s.get('state')}" for s in servers) or "no server"
fresh = time.time() - float(discovery.get("updated_at", 0)) <= float(discovery.get("stale_after_s", 10))
mine = str(discovery.get("supervisor_pid")) == sys.argv[2]
print(states)
sys.exit(0 if fresh and mine and servers and all(s.get("state") == "ready" for s in servers) else 1)
EOF
}

start() {
  if [ ! -d "$RUNTIME" ]; then
    # The node's own rule: its default folder private, a folder it is given readable by all. A start
    # running at the same time may make it first.
    mkdir -p "$(dirname "$RUNTIME")"
    mkdir -m "$([ -n "${UDFSERVE_RUNTIME_DIR:-}" ] && echo 0755 || echo 0700)" "$RUNTIME" 2>/dev/null \
      || [ -d "$RUNTIME" ] || { say "cannot create the runtime folder $RUNTIME" >&2; exit 1; }
  fi
  export UDFSERVE_RUNTIME_DIR="$RUNTIME"
  # One start at a time: a second run waits for the first, then finds its node.
  exec 8>"$RUNTIME/init.lock"
  flock -w 900 8 || { say "another start held $RUNTIME/init.lock for 900 s" >&2; exit 1; }
  local started=""
  if node_running; then
    say "udfserve node already runs in $RUNTIME (supervisor pid $(supervisor_pid))"
  else
    mkdir -p "$(dirname "$LOG")"
    # Its own session and process group (setsid does not fork here: a background job of a
    # non-interactive shell is no group leader), no terminal, no descriptor of this script.
    setsid "$UDFSERVE" node </dev/null >>"$LOG" 2>&1 8>&- &
    started=$!
    say "started udfserve node (supervisor pid $started) in $RUNTIME, log $LOG"
  fi
  [ "$WAIT_S" -gt 0 ] || return 0
  local deadline=$(( SECONDS + WAIT_S )) found=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    if node_running && found=$(node_ready); then
      say "ready after $SECONDS s: $found"
      return 0
    fi
    if [ -n "$started" ] && ! kill -0 "$started" 2>/dev/null; then
      wait "$started" && code=0 || code=$?
      say "udfserve node exited with code $code during its start; the end of $LOG:" >&2
      tail -n 30 "$LOG" >&2
      exit 1
    fi
    sleep 1
  done
  say "not ready after $WAIT_S s (${found:-no discovery file}); it goes on starting, and the executors" \
    "use the CPU fallback until it is ready; log $LOG" >&2
}

stop() {
  if ! node_running; then
    say "no udfserve node runs in $RUNTIME"
    return 0
  fi
  local pid
  pid=$(supervisor_pid)
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$(( SECONDS + STOP_S ))
  # A supervisor this script started leads its process group (setsid above): the group is it and
  # its servers. One started otherwise is waited for by its lock and its pid.
  alive() { node_running || kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null; }
  while alive && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
  if alive; then
    say "the node (supervisor pid $pid) still ran after $STOP_S s: SIGKILL to it and its process group" >&2
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  say "stopped udfserve node (supervisor pid $pid)"
}

case "$ACTION" in
  start) start ;;
  stop) stop ;;
  status)
    if node_running; then supervisor_pid; echo; else exit 1; fi ;;
  *) say "unknown action '$ACTION'; expected start, stop or status" >&2; exit 2 ;;
esac
