#!/usr/bin/env bash
# A Spark standalone cluster of several nodes in containers (deploy/cluster/), built and run for real
# in a Docker engine on this machine, checked while nodes and servers fail and join, then taken down.
#
#   sudo bash scripts/cluster_smoke.sh [--nodes N] [--rows N] [--fault-rows N] [--checks abcdef]
#                                      [--layout daemonset|init-script] [--servers-from-job]
#                                      [--keep-data-root] [--keep-logs]
#
# For a Debian 12 machine that reaches Debian's package archive and PyPI but no image registry. It
# needs root, so it is not part of the test run (scripts/test.sh). Steps:
#   1. the engine, the local base images and the project's images, as scripts/compose_smoke.sh makes
#      them (scripts/engine.sh): the server image for the CPU (TENSORFLOW_EXTRA empty), the Spark
#      image, and for the init-script layout deploy/cluster/Dockerfile.worker;
#   2. the cluster: deploy/cluster/cluster.yml (master, Prometheus, the driver container, the shared
#      model repository and output folder), then N nodes of deploy/cluster/node.yml (default 3),
#      each its own compose project with its own host name and network namespace; the layout:
#        daemonset    (default) a Spark worker and a `udfserve node` container per node;
#        init-script  a Spark worker whose start-up hook, deploy/spark/udfserve-init.sh, starts the
#                     node in the worker's own container;
#        --servers-from-job  no node started: the job starts them (udfserve.spark_client.node_servers);
#   3. the checks, each a job whose output Spark's committer writes to the shared folder, read back
#      afterwards (deploy/cluster/cluster_job.py, cluster_figures.py; judged by checks.py):
#        a. node-local routing: --rows ids (2,000,000) over every node; each node's servers answer
#           exactly the rows of the tasks that ran on it; 0 crossed; 0 by the fallback;
#        f. Prometheus scrapes every server and supervisor of every node, and job a's
#           per-application series add up to its rows (again at the end, for the nodes then);
#        b. one node's server SIGKILLed mid-job (--fault-rows ids, 600,000);
#        c. one whole node stopped mid-job (its containers SIGKILLed);
#        d. a node started mid-job;
#        e. a model version published mid-job on nodes that poll the repository;
#   4. everything taken down: every node's project and the cluster's (`down -v`: containers, volumes,
#      networks), and an engine this script started with what it changed on the host. Its data root
#      (the image cache) is deleted unless --keep-data-root. --keep-logs keeps the run's folder (the
#      jobs' logs, every figure the checks read) and says where it is.
# Each step prints its time; the last lines give the run's duration, the memory it used at its peak,
# and which checks held.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
# A command that fails ends the run: say which, and where.
trap 'echo "cluster_smoke.sh: line $LINENO: \`$BASH_COMMAND\` exited with $?" >&2' ERR

NODES=3
ROWS=2000000
FAULT_ROWS=600000
CHECKS=abcdef
LAYOUT=daemonset
KEEP_DATA_ROOT=0
KEEP_LOGS=0
usage() { sed -n '2,36p' "$0" | cut -c3-; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --rows) ROWS="$2"; shift 2 ;;
    --fault-rows) FAULT_ROWS="$2"; shift 2 ;;
    --checks) CHECKS="$2"; shift 2 ;;
    --layout) LAYOUT="$2"; shift 2 ;;
    --servers-from-job) LAYOUT=job; shift ;;
    --keep-data-root) KEEP_DATA_ROOT=1; shift ;;
    --keep-logs) KEEP_LOGS=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument $1; expected --nodes N, --rows N, --fault-rows N, --checks abcdef," \
         "--layout daemonset|init-script, --servers-from-job, --keep-data-root or --keep-logs" >&2; exit 2 ;;
  esac
done
case "$LAYOUT" in
  daemonset) WORKER_SERVICE=spark-worker; NODE_SERVICE=udfserve-node ;;
  init-script) WORKER_SERVICE=spark-worker-init; NODE_SERVICE=spark-worker-init ;;
  job) WORKER_SERVICE=spark-worker-job; NODE_SERVICE=spark-worker-job ;;
  *) echo "--layout $LAYOUT: expected daemonset or init-script (or --servers-from-job)" >&2; exit 2 ;;
esac
if [ "$LAYOUT" = job ] && ! grep -q '"node_servers"' spark_client/__init__.py; then
  echo "--servers-from-job: the job would start the nodes' servers through udfserve.spark_client.node_servers," \
    "which this tree does not have yet; run the daemonset or init-script layout instead" >&2
  exit 2
fi
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 2 ] || { echo "--nodes $NODES: expected 2 or more" >&2; exit 2; }
[[ "$ROWS" =~ ^[0-9]+$ && "$FAULT_ROWS" =~ ^[0-9]+$ ]] || { echo "--rows and --fault-rows take a number" >&2; exit 2; }
[[ "$CHECKS" =~ ^[a-f]+$ ]] || { echo "--checks $CHECKS: expected letters of abcdef" >&2; exit 2; }

WORK=$(mktemp -d /tmp/udfserve-cluster.XXXXXX)
# The engine, the base and project images, and the step and check helpers, shared with compose_smoke.sh.
# shellcheck source=scripts/engine.sh
source scripts/engine.sh

CLUSTER=udfserve-cluster
POLL_S=2
SETTLE_S=2
export UDFSERVE_SERVER_IMAGE="udfserve/server:$VERSION-cpu"
export UDFSERVE_SPARK_IMAGE="udfserve/spark:$VERSION"
export UDFSERVE_WORKER_IMAGE="udfserve/cluster-worker:$VERSION"
export UDFSERVE_PROMETHEUS_IMAGE="$PROMETHEUS_IMAGE"
export UDFSERVE_CLUSTER_TARGETS="$WORK/prometheus-targets"
export UDFSERVE_CLUSTER_POLL_S=$POLL_S UDFSERVE_CLUSTER_SETTLE_S=$SETTLE_S
mkdir -m 0755 "$UDFSERVE_CLUSTER_TARGETS"
CURRENT=()   # the nodes in the cluster now
STARTED=()   # every node project started, for the clean-up
SAMPLER_PID=""
DRIVER=""

cluster() { docker compose -p "$CLUSTER" -f deploy/cluster/cluster.yml "$@"; }
node_compose() {  # node_compose NODE ARGS...: compose of that node's project
  local name=$1
  shift
  UDFSERVE_CLUSTER_NODE="$name" docker compose -p "$CLUSTER-$name" -f deploy/cluster/node.yml --profile "$LAYOUT" "$@"
}
container() { node_compose "$1" ps -q "$2"; }  # container NODE SERVICE
in_worker() { local name=$1; shift; docker exec "$(container "$name" "$WORKER_SERVICE")" "$@"; }
in_node() { local name=$1; shift; docker exec "$(container "$name" "$NODE_SERVICE")" "$@"; }
in_driver() { docker exec "$DRIVER" "$@"; }
node_figures() { in_worker "$1" python3 /opt/udfserve-cluster/cluster_figures.py node; }
json_field() {  # json_field EXPRESSION: evaluate a Python expression on stdin's JSON object `j`
  python3 -c "import json, sys; j = json.load(sys.stdin); print($1)"
}
app_rows() {  # app_rows NODE APP: rows the node's servers answered for the application
  node_figures "$1" 2>/dev/null | json_field "sum(int(s.get('app_rows', {}).get('$2', 0)) for s in j['servers'])" \
    2>/dev/null || echo 0
}
job_rows() {  # job_rows APP: rows every node's servers answered for the application
  local total=0 name
  for name in "${CURRENT[@]}"; do total=$(( total + $(app_rows "$name" "$1") )); done
  echo "$total"
}
rows_past() { [ "$(app_rows "$1" "$2")" -ge "$3" ]; }   # rows_past NODE APP ROWS
job_rows_past() { [ "$(job_rows "$1")" -ge "$2" ]; }     # job_rows_past APP ROWS
seconds_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }  # seconds_between T0 T1

# -- clean-up --------------------------------------------------------------------------------------
stop_sampler() {
  if [ -n "$SAMPLER_PID" ]; then
    kill -TERM "$SAMPLER_PID" 2>/dev/null || true
    wait "$SAMPLER_PID" 2>/dev/null || true
    SAMPLER_PID=""
  fi
}
take_down() {
  local name
  for name in "${STARTED[@]}"; do node_compose "$name" down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true; done
  cluster down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
}
remove_work() {
  if [ "$KEEP_LOGS" -eq 1 ]; then echo "  the run's logs and figures: $WORK"; else rm -rf "$WORK"; fi
}
cleanup() {
  local status=$?
  set +e
  stop_sampler
  if engine_answers; then take_down; fi
  stop_engine
  remove_work
  exit "$status"
}
trap cleanup EXIT

step "engine"
engine_up

step "local base images"
build_base_images

step "project images"
# A CPU-only server image (no CUDA wheels: no GPU here), and no native front end, which the cluster
# does not use; the Spark image as compose_smoke.sh builds it; the worker with udfserve node for the
# layouts that run the node in the worker's container.
build_image server deploy/docker/Dockerfile.server "$UDFSERVE_SERVER_IMAGE" \
  --build-arg TENSORFLOW_EXTRA= --build-arg NATIVE_FRONTEND=off
build_image spark
if [ "$LAYOUT" != daemonset ]; then
  build_image cluster-worker deploy/cluster/Dockerfile.worker "$UDFSERVE_WORKER_IMAGE" \
    --build-arg SPARK_IMAGE="$UDFSERVE_SPARK_IMAGE"
fi

# -- the cluster -----------------------------------------------------------------------------------
# Prometheus reads one targets file per node: the node's own, as its supervisor wrote it.
publish_targets() {  # publish_targets NODE
  in_node "$1" cat /run/udfserve/prometheus-targets.json > "$UDFSERVE_CLUSTER_TARGETS/.$1.json"
  chmod 0644 "$UDFSERVE_CLUSTER_TARGETS/.$1.json"
  mv "$UDFSERVE_CLUSTER_TARGETS/.$1.json" "$UDFSERVE_CLUSTER_TARGETS/$1.json"
}
node_up() {  # node_up NODE: its containers, once its worker is healthy (the daemonset's after its node's readiness)
  node_compose "$1" up -d --wait --wait-timeout 600 >"$WORK/up-$1.log" 2>&1 \
    || { tail -20 "$WORK/up-$1.log" >&2; node_compose "$1" logs --tail 30 >&2 || true; return 1; }
}
alive_workers() {
  in_driver python3 -c '
import json, urllib.request
state = json.load(urllib.request.urlopen("http://spark-master:8080/json/", timeout=10))
print(" ".join(sorted(w["host"] for w in state["workers"] if w["state"] == "ALIVE")))'
}
workers_are() { [ "$(alive_workers)" = "$*" ]; }
describe_node() {  # one line: host name, address, servers and how they are reached
  local address
  address=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(container "$1" host)")
  node_figures "$1" | python3 -c '
import json, sys
j = json.load(sys.stdin)
servers = ", ".join(
    "%s pid %s %s on unix:%s, %s" % (s["device"], s["pid"], s["state"], s["unix_socket"],
                                     "tcp " + s["tcp_address"] if s["tcp_address"] else "no gRPC TCP port")
    for s in j["servers"])
print("%s (%s): discovery file of node %r, %s" % (j["host"], sys.argv[1], j.get("node"), servers or "no server"))
' "$address"
}

step "cluster up: master, Prometheus, driver, $NODES nodes ($LAYOUT)"
python3 deploy/cluster/memory_peak.py --project-prefix "$CLUSTER" --out "$WORK/memory.json" &
SAMPLER_PID=$!
cluster config -q
cluster up -d --wait --wait-timeout 600 2>&1 | tail -3
DRIVER=$(cluster ps -q driver)
NAMES=()
for i in $(seq "$NODES"); do NAMES+=("node$i"); done
STARTED+=("${NAMES[@]}")
pids=()
for name in "${NAMES[@]}"; do node_up "$name" & pids+=($!); done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { failed "node ${NAMES[$i]} comes up"; exit 1; }
done
CURRENT=("${NAMES[@]}")
if [ "$LAYOUT" != job ]; then  # with --servers-from-job, nodes run while a job does
  for name in "${CURRENT[@]}"; do publish_targets "$name"; done
fi
if wait_for 120 "$NODES workers alive at the master" workers_are "${CURRENT[@]}"; then
  held "the master lists $NODES alive workers, one per node: $(alive_workers)"
else
  failed "the master lists $NODES alive workers (it lists '$(alive_workers)')"
fi
for name in "${CURRENT[@]}"; do echo "  $(describe_node "$name")"; done

# -- the checks ------------------------------------------------------------------------------------
JOB_PID=""
JOB_HOSTS=()
run_job() {  # run_job CHECK ROWS PARTITIONS EXECUTORS [ARGS...]: the job, in the background
  local check=$1 rows=$2 partitions=$3 executors=$4
  shift 4
  mkdir -p "$WORK/$check"
  JOB_HOSTS=("${CURRENT[@]}")  # the nodes when the job started
  local extra=()
  [ "$LAYOUT" != job ] || extra=(--servers-from-job --hold-nodes-until "/output/$check.release")
  in_driver python3 /opt/udfserve-cluster/cluster_job.py --name "$check" --rows "$rows" --partitions "$partitions" \
    --executors "$executors" --output "/output/$check" "${extra[@]}" "$@" \
    >"$WORK/$check/job.out" 2>"$WORK/$check/job.err" &
  JOB_PID=$!
}
has_app() { grep -q '^APP ' "$WORK/$1/job.out"; }
job_app() { sed -n 's/^APP //p' "$WORK/$1/job.out"; }
job_running() { kill -0 "$JOB_PID" 2>/dev/null; }
wait_app() {  # wait_app CHECK: the application id, once the job's session runs
  wait_for 300 "job $1's Spark application" has_app "$1" || { tail -20 "$WORK/$1/job.err" >&2; return 1; }
  job_app "$1"
}
finish_job() {  # finish_job CHECK: wait for the job, keep its report as job.json
  local status=0
  wait "$JOB_PID" || status=$?
  sed -n 's/^JOB //p' "$WORK/$1/job.out" > "$WORK/$1/job.json"
  if [ "$status" -ne 0 ] || [ ! -s "$WORK/$1/job.json" ]; then
    echo "  job $1 exited with $status; the end of its log:" >&2
    grep -v '^\s*at \|WARN' "$WORK/$1/job.err" | tail -25 >&2
  fi
}
collect() {  # collect CHECK ROWS [--reference REPOSITORY]: node figures and the committed output, read back
  local check=$1 rows=$2 name
  shift 2
  for name in "${CURRENT[@]}"; do node_figures "$name" > "$WORK/$check/node-$name.json"; done
  in_driver python3 /opt/udfserve-cluster/cluster_figures.py output "/output/$check" --rows "$rows" "$@" \
    > "$WORK/$check/output.json" 2>"$WORK/$check/output.err" || tail -5 "$WORK/$check/output.err" >&2
}
judge() {  # judge CHECK FOLDER: checks.py's figures, and its claims as held or failed
  local line
  while IFS= read -r line; do
    case "$line" in
      "HELD "*) held "$1: ${line#HELD }" ;;
      "FAILED "*) failed "$1: ${line#FAILED }" ;;
      *) echo "$line" ;;
    esac
  done < <(python3 deploy/cluster/checks.py "$1" "$2")
}
want() { [[ "$CHECKS" == *"$1"* ]]; }

# With --servers-from-job the nodes live while the job does: their figures are read once the job has
# written its output and before it lets them go; then no udfserve process may be left on any host.
written_or_ended() { grep -q '^WRITTEN$' "$WORK/$1/job.out" || ! job_running; }
node_processes() {  # node_processes NODE: the udfserve node and server processes of the node's worker
  docker top "$(container "$1" "$WORKER_SERVICE")" -eo pid,args 2>/dev/null \
    | grep -E '(-m udfserve|bin/udfserve) (node|serve)|udfserve\.services\.node' || true
}
no_node_processes() { [ -z "$(node_processes "$1")" ]; }
end_job() {  # end_job CHECK ROWS [--reference REPOSITORY]: the job to its end, its figures collected
  local check=$1 rows=$2 name gone=()
  shift 2
  if [ "$LAYOUT" != job ]; then
    finish_job "$check"
    collect "$check" "$rows" "$@"
    return
  fi
  wait_for 3600 "job $check's output" written_or_ended "$check" || true
  for name in "${CURRENT[@]}"; do publish_targets "$name" 2>/dev/null || true; done
  # The start stage's own account: one node per host, each with its supervisor.
  local started
  started=$(sed -n 's/^NODES //p' "$WORK/$check/job.out" | python3 -c '
import json, sys
hosts = json.load(sys.stdin)
print(" ".join(sorted(h["host"] for h in hosts)), "|",
      ", ".join("%s supervisor %s, servers %s" % (h["host"], h["supervisor_pid"], h["server_pids"]) for h in hosts))' \
    2>/dev/null || echo "|")
  if [ "${started%% |*}" = "$(printf '%s\n' "${JOB_HOSTS[@]}" | sort | xargs)" ]; then
    held "$check: the job's start stage started one node per host: ${started#*| }"
  else
    failed "$check: the job's start stage started one node per host (${started:-no NODES line}; hosts ${JOB_HOSTS[*]})"
  fi
  collect "$check" "$rows" "$@"
  if [ "$check" = a ] && want f; then metrics_check a "$rows"; fi
  in_driver touch "/output/$check.release"
  finish_job "$check"
  for name in "${CURRENT[@]}"; do
    rm -f "$UDFSERVE_CLUSTER_TARGETS/$name.json"
    wait_for 120 "$name's node to stop" no_node_processes "$name" || gone+=("$name: $(node_processes "$name" | tr '\n' ' ')")
  done
  if [ "${#gone[@]}" -eq 0 ]; then
    held "$check: the nodes the job started stopped when it ended: no udfserve process left on ${CURRENT[*]}"
  else
    failed "$check: the nodes the job started stopped when it ended (left: ${gone[*]})"
  fi
}
write_fault() {  # write_fault CHECK KEY=VALUE...: what was done to the cluster, for checks.py
  python3 -c '
import json, sys
def value(text):
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text
print(json.dumps({key: value(text) for key, _, text in (a.partition("=") for a in sys.argv[1:])}))' "${@:2}" \
    > "$WORK/$1/fault.json"
}

prometheus_counts() {  # prometheus_counts APP ROWS: Prometheus has scraped the job's last counts
  in_driver python3 /opt/udfserve-cluster/cluster_figures.py prometheus --app-id "$1" \
    | json_field "sum(j['app_rows_by_node'].values()) >= $2 and all(t['health'] == 'up' for t in j['targets'])" \
    | grep -q True
}
metrics_check() {  # metrics_check CHECK ROWS: f, for the job of CHECK and the nodes now
  local folder="$WORK/f-$1" app
  mkdir -p "$folder"
  app=$(job_app "$1")
  echo "{\"app_id\": \"$app\", \"rows\": $2}" > "$folder/job.json"
  wait_for 90 "Prometheus to scrape every target and job $1's last counts" prometheus_counts "$app" "$2" || true
  for name in "${CURRENT[@]}"; do node_figures "$name" > "$folder/node-$name.json"; done
  in_driver python3 /opt/udfserve-cluster/cluster_figures.py prometheus --app-id "$app" > "$folder/prometheus.json"
  judge metrics "$folder"
}
partitions_for() { echo $(( $1 * 8 )); }  # 8 tasks per executor: every node gets work, and waves to spare

if want a; then
  step "a. node-local routing: $ROWS rows over ${#CURRENT[@]} nodes"
  run_job a "$ROWS" "$(partitions_for "${#CURRENT[@]}")" "${#CURRENT[@]}"
  end_job a "$ROWS"
  judge routing "$WORK/a"
fi

if want f && want a && [ "$LAYOUT" != job ]; then  # with --servers-from-job, f runs within job a
  step "f. metrics: Prometheus and job a's per-application series"
  metrics_check a "$ROWS"
fi

restarted_ready() {  # restarted_ready NODE PID: the node's servers are ready, none of them PID
  [ "$(node_figures "$1" | json_field "bool(j['servers']) and all(s['state'] == 'ready' and s['pid'] != $2 for s in j['servers'])")" = True ]
}
if want b; then
  victim=${CURRENT[1]}
  # Long tasks, 2 per executor; the first wave runs, the rest waits for the kill. The victim's first
  # task stops twice, whatever the machine's speed: once its server has answered 2 requests (4,096
  # rows each, the client's rows_per_request), while the server is SIGKILLed; and once 5 more
  # requests are scored (past the 4 the client keeps in flight: at least one of them after the kill,
  # answered by the CPU fallback), until the supervisor's restarted server is ready and the circuit
  # the client opened at the failure has closed again (circuit_reset_s, 10 s): the rest of the task
  # goes to the restarted server.
  partitions=$(( 2 * ${#CURRENT[@]} ))
  first=$(( 2 * 4096 ))
  second=$(( first + 5 * 4096 ))
  step "b. a server killed mid-job: SIGKILL to $victim's model server, $FAULT_ROWS rows"
  run_job b "$FAULT_ROWS" "$partitions" "${#CURRENT[@]}" --hold-from-partition "${#CURRENT[@]}" --gate /output/b.gate \
    --pause-host "$victim" --pause-after-rows "$first,$second" --pause-gates /output/b.killed,/output/b.restarted \
    --pause-min-s 12
  app=$(wait_app b)
  wait_for 900 "$victim's first task to stop after $first rows" in_driver test -e /output/b.killed.waiting || true
  figures=$(node_figures "$victim")
  pid=$(json_field "j['servers'][0]['pid']" <<<"$figures")
  at=$(json_field "j['servers'][0].get('app_rows', {}).get('$app', 0)" <<<"$figures")
  in_node "$victim" sh -c "kill -9 $pid"
  in_driver touch /output/b.killed /output/b.gate
  echo "  killed server pid $pid on $victim (SIGKILL), which had answered $at rows of the job, while its task" \
    "stood after $first rows; the task and the held tasks released"
  wait_for 300 "$victim's restarted server" restarted_ready "$victim" "$pid" || true
  wait_for 300 "$victim's task to stop after $second rows" in_driver test -e /output/b.restarted.waiting || true
  in_driver touch /output/b.restarted
  echo "  $victim's supervisor restarted its server (pid $(node_figures "$victim" | json_field "j['servers'][0]['pid']"));" \
    "the task stood after $second rows until then, and goes on"
  write_fault b victim="$victim" killed_pid="$pid" rows_at_kill="$at"
  end_job b "$FAULT_ROWS"
  judge server-killed "$WORK/b"
fi

if want c; then
  victim=${CURRENT[${#CURRENT[@]}-1]}
  partitions=$(partitions_for "${#CURRENT[@]}")
  step "c. a node lost mid-job: $victim stopped whole (SIGKILL), $FAULT_ROWS rows"
  run_job c "$FAULT_ROWS" "$partitions" "${#CURRENT[@]}" --hold-from-partition "${#CURRENT[@]}" --gate /output/c.gate
  app=$(wait_app c)
  threshold=$(( FAULT_ROWS / partitions / 2 ))
  wait_for 900 "$victim's server to answer $threshold rows of the job" rows_past "$victim" "$app" "$threshold" || true
  at=$(app_rows "$victim" "$app")
  node_compose "$victim" kill -s SIGKILL >/dev/null 2>&1
  in_driver touch /output/c.gate
  rm -f "$UDFSERVE_CLUSTER_TARGETS/$victim.json"
  echo "  stopped $victim (worker, udfserve node, host: SIGKILL) once its server had answered $at rows of the job;" \
    "the held tasks released"
  write_fault c victim="$victim" rows_at_stop="$at"
  survivors=()
  for name in "${CURRENT[@]}"; do [ "$name" = "$victim" ] || survivors+=("$name"); done
  CURRENT=("${survivors[@]}")
  end_job c "$FAULT_ROWS"
  judge node-lost "$WORK/c"
  node_compose "$victim" down -v --timeout 5 >/dev/null 2>&1
  if wait_for 120 "the master to drop $victim" workers_are "${CURRENT[@]}"; then
    held "c: the master dropped $victim's worker; alive: $(alive_workers)"
  else
    failed "c: the master dropped $victim's worker (alive: '$(alive_workers)')"
  fi
fi

executor_on() {  # executor_on HOST: the running job has an executor on HOST
  in_driver python3 /opt/udfserve-cluster/cluster_figures.py executors | grep -q "\"$1\""
}
if want d; then
  new="node$(( NODES + 1 ))"
  hold_from=$(( 2 * ${#CURRENT[@]} ))
  step "d. a node added mid-job: $new joins, $FAULT_ROWS rows (partitions from $hold_from held until it is in)"
  # Tasks for one node more than run now: the new node's executor finds work when it joins.
  run_job d "$FAULT_ROWS" "$(partitions_for $(( ${#CURRENT[@]} + 1 )))" "${#CURRENT[@]}" \
    --hold-from-partition "$hold_from" --gate /output/d.gate
  app=$(wait_app d)
  job_started=$(date +%s.%N)
  wait_for 900 "job d to score" job_rows_past "$app" 1 || true
  up_started=$(date +%s.%N)
  STARTED+=("$new")
  node_up "$new" || failed "d: $new comes up"
  ready=$(date +%s.%N)
  wait_for 300 "an executor of job d on $new" executor_on "$new" || true
  joined=$(date +%s.%N)
  [ "$LAYOUT" = job ] || publish_targets "$new" || true  # a job-started node runs from its first task on
  in_driver touch /output/d.gate
  echo "  $new: started $(seconds_between "$job_started" "$up_started") s into the job; up and ready after" \
    "$(seconds_between "$up_started" "$ready") s; its executor in the job" \
    "$(seconds_between "$up_started" "$joined") s after it started; the held partitions released"
  CURRENT+=("$new")
  write_fault d layout="$LAYOUT" new_node="$new" started_after_s="$(seconds_between "$job_started" "$up_started")" \
    ready_s="$(seconds_between "$up_started" "$ready")" joined_s="$(seconds_between "$up_started" "$joined")"
  end_job d "$FAULT_ROWS"
  judge node-added "$WORK/d"
  echo "  $(describe_node "$new")"
fi

publish_version() {  # publish_version N: the docs' recipe; prints the time of the rename
  cluster run --rm --no-deps -T models sh -ec "
    stage=\$(mktemp -d)
    cp -r /models/tabular_mlp \"\$stage/\"
    udfserve models generate --output \"\$stage\" --publish-version $1 --only tabular_mlp >/dev/null 2>&1
    cp -r \"\$stage/tabular_mlp/$1\" /models/tabular_mlp/.$1.incoming
    python3 -c 'import os, time; os.rename(\"/models/tabular_mlp/.$1.incoming\", \"/models/tabular_mlp/$1\"); print(time.time())'"
}
if want e; then
  hold_from=$(( 2 * ${#CURRENT[@]} ))
  step "e. a rollout: version 2 published mid-job, $FAULT_ROWS rows, nodes polling every $POLL_S s (settle $SETTLE_S s)"
  run_job e "$FAULT_ROWS" "$(partitions_for "${#CURRENT[@]}")" "${#CURRENT[@]}" --with-version \
    --hold-from-partition "$hold_from" --gate /output/e.gate
  app=$(wait_app e)
  job_started=$(date +%s.%N)
  wait_for 900 "job e's first rows" job_rows_past "$app" $(( FAULT_ROWS / ${#CURRENT[@]} / 8 )) || true
  # Each node's server, watched from the driver over the cluster network until it serves version 2.
  servers=""
  for name in "${CURRENT[@]}"; do
    port=$(node_figures "$name" | json_field "j['servers'][0]['http_address'].rsplit(':', 1)[1]")
    servers="${servers:+$servers,}$name=$name:$port"
  done
  in_driver python3 /opt/udfserve-cluster/cluster_figures.py watch-versions --servers "$servers" --version 2 \
    --timeout-s 900 > "$WORK/e/watch.json" &
  watcher=$!
  at=$(job_rows "$app")
  published=$(publish_version 2)
  echo "  version 2 of tabular_mlp renamed into the repository at $published, $at rows into the job"
  wait "$watcher" || true
  in_driver touch /output/e.gate
  write_fault e published_at="$published" \
    published_after_s="$(seconds_between "$job_started" "$published")" rows_at_publish="$at" \
    poll_s="$POLL_S" settle_s="$SETTLE_S" hold_from_partition="$hold_from" \
    nodes="$(IFS=,; echo "${CURRENT[*]}")"
  end_job e "$FAULT_ROWS" --reference /models
  # A job built after the publish, on every node.
  after_rows=$(( FAULT_ROWS / 4 ))
  run_job e-after "$after_rows" "$(( 2 * ${#CURRENT[@]} ))" "${#CURRENT[@]}" --with-version
  end_job e-after "$after_rows" --reference /models
  mkdir -p "$WORK/e/after"
  cp "$WORK/e-after/job.json" "$WORK/e-after/output.json" "$WORK/e/after/"
  judge rollout "$WORK/e"
fi

if want f && [ "$LAYOUT" != job ]; then
  last=""
  for check in e-after d a; do if want "${check:0:1}" && [ -s "$WORK/$check/job.json" ]; then last=$check; break; fi; done
  if [ -n "$last" ]; then
    step "f. metrics at the end: the nodes now (${CURRENT[*]}), job $last's series"
    metrics_check "$last" "$(json_field "j['rows']" < "$WORK/$last/job.json")"
  fi
fi

# -- down ------------------------------------------------------------------------------------------
step "down: every node's project and the cluster's, down -v"
stop_sampler
take_down
left=0
for name in "${STARTED[@]}" ""; do
  project="$CLUSTER${name:+-$name}"
  left=$(( left + $(docker ps -aq --filter "label=com.docker.compose.project=$project" | wc -l) \
    + $(docker volume ls -q --filter "label=com.docker.compose.project=$project" | wc -l) \
    + $(docker network ls -q --filter "label=com.docker.compose.project=$project" | wc -l) ))
done
named=$(docker volume ls -q | grep -c "^$CLUSTER" || true)
if [ "$left" -eq 0 ] && [ "$named" -eq 0 ]; then
  held "down -v left no container, volume or network of the cluster (${#STARTED[@]} node projects and the cluster's)"
else
  failed "down -v left $left containers, volumes or networks and $named named volumes"
fi
step_done
trap - EXIT
stop_engine
memory=$(python3 deploy/cluster/memory_peak.py --report "$WORK/memory.json" 2>/dev/null || echo "peak memory: not measured")
remove_work
echo
echo "cluster smoke ($LAYOUT, $NODES nodes, checks $CHECKS): $(( $(date +%s) - SCRIPT_START )) s; $memory"
echo "${#HELD[@]} checks held, ${#FAILED[@]} failed.${FAILED[*]:+ Failed: $(joined "${FAILED[@]}").}"
[ "${#FAILED[@]}" -eq 0 ] || exit 1
