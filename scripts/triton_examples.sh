#!/usr/bin/env bash
# Run Triton's published example clients, unchanged, against udfserve, and print a table of the
# results (docs/kserve.md, "Triton's example clients, run unchanged", was made with it).
#
#   bash scripts/triton_examples.sh CLIENT_REPO/src/python/examples
#
# The folder is src/python/examples of a checkout of github.com/triton-inference-server/client.
# Its .py files are copied into a temporary folder and run from there with this environment's
# python (tritonclient and numpy installed: `pip install 'tritonclient[all]'`), each with
# `-u` naming the server's gRPC or HTTP address, as Triton's own docs run them. The server serves
# the models the clients call (`python -m udfserve.services.examples.triton_examples`: simple,
# simple_int8, simple_string, simple_identity, custom_identity_int32) with
# `--model-control explicit` (the model control examples load and unload) and system shared
# memory on (the default).
#
# Ports: Triton's own, 8001 for gRPC and 8000 for HTTP (memory_growth_test.py has them written in),
# or GRPC_PORT and HTTP_PORT. CLIENT_TIMEOUT_S (120) bounds each client; PYTHON chooses the
# interpreter (default: python on PATH). A client passes when it exits 0 and prints its PASS line
# where it has one; the reason of a failure is its FAILED line, gRPC's details, or the last line
# it printed. KEEP_LOGS=1 keeps the clients' output.
set -euo pipefail

examples=${1:?usage: scripts/triton_examples.sh CLIENT_REPO/src/python/examples}
[[ -f $examples/simple_grpc_infer_client.py ]] || {
  echo "$examples holds no simple_grpc_infer_client.py: expected src/python/examples of Triton's client repository" >&2
  exit 2
}
python=${PYTHON:-python}
grpc_port=${GRPC_PORT:-8001}
http_port=${HTTP_PORT:-8000}
timeout_s=${CLIENT_TIMEOUT_S:-120}

work=$(mktemp -d -t udfserve-triton-examples.XXXXXX)
server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/clients" "$work/logs"
cp "$examples"/*.py "$work/clients/"
"$python" -m udfserve.services.examples.triton_examples --output "$work/models" >"$work/logs/generate.log" 2>&1 || {
  cat "$work/logs/generate.log" >&2
  exit 1
}

"$python" -m udfserve serve --model-repository "$work/models" --device cpu --port "$grpc_port" \
  --kserve-http-port "$http_port" --http-port off --model-control explicit \
  --ready-file "$work/ready.json" >"$work/logs/server.log" 2>&1 &
server_pid=$!
deadline=$((SECONDS + 120))
until curl -sf "http://127.0.0.1:$http_port/v2/health/ready" >/dev/null 2>&1; do
  if ! kill -0 "$server_pid" 2>/dev/null || ((SECONDS > deadline)); then
    echo "the server did not become ready on ports $grpc_port and $http_port; its log:" >&2
    tail -n 40 "$work/logs/server.log" >&2
    exit 1
  fi
  sleep 0.5
done

grpc_url=localhost:$grpc_port
http_url=localhost:$http_port
# file | protocol | arguments (empty: not run, and the reason follows)
clients=(
  "simple_grpc_infer_client.py|gRPC|-u $grpc_url"
  "simple_grpc_async_infer_client.py|gRPC|-u $grpc_url"
  "simple_grpc_aio_infer_client.py|gRPC|-u $grpc_url"
  "simple_grpc_custom_args_client.py|gRPC|-u $grpc_url"
  "simple_grpc_keepalive_client.py|gRPC|-u $grpc_url"
  "simple_grpc_string_infer_client.py|gRPC|-u $grpc_url"
  "simple_grpc_shm_client.py|gRPC|-u $grpc_url"
  "simple_grpc_shm_string_client.py|gRPC|-u $grpc_url"
  "simple_grpc_health_metadata.py|gRPC|-u $grpc_url"
  "simple_grpc_model_control.py|gRPC|-u $grpc_url"
  "grpc_explicit_int_content_client.py|gRPC|-u $grpc_url"
  "grpc_explicit_int8_content_client.py|gRPC|-u $grpc_url"
  "grpc_explicit_byte_content_client.py|gRPC|-u $grpc_url"
  "reuse_infer_objects_client.py|gRPC|-i grpc -u $grpc_url"
  "memory_growth_test.py|gRPC|-i grpc"
  "simple_grpc_cudashm_client.py|gRPC|-u $grpc_url"
  "simple_grpc_sequence_sync_infer_client.py|gRPC|-u $grpc_url"
  "simple_grpc_sequence_stream_infer_client.py|gRPC|-u $grpc_url"
  "simple_grpc_aio_sequence_stream_infer_client.py|gRPC|-u $grpc_url"
  "simple_grpc_custom_repeat.py|gRPC|-u $grpc_url"
  "grpc_client.py|gRPC|-u $grpc_url"
  "simple_http_infer_client.py|HTTP|-u $http_url"
  "simple_http_async_infer_client.py|HTTP|-u $http_url"
  "simple_http_aio_infer_client.py|HTTP|-u $http_url"
  "simple_http_string_infer_client.py|HTTP|-u $http_url"
  "simple_http_shm_client.py|HTTP|-u $http_url"
  "simple_http_shm_string_client.py|HTTP|-u $http_url"
  "simple_http_health_metadata.py|HTTP|-u $http_url"
  "simple_http_model_control.py|HTTP|-u $http_url"
  "reuse_infer_objects_client.py|HTTP|-i http -u $http_url"
  "memory_growth_test.py|HTTP|-i http"
  "simple_http_cudashm_client.py|HTTP|-u $http_url"
  "simple_http_sequence_sync_infer_client.py|HTTP|-u $http_url"
  "image_client.py|gRPC, HTTP||not run: takes an image file and an image classification model (densenet_onnx, inception_graphdef)"
  "grpc_image_client.py|gRPC||not run: takes an image file and an image classification model"
  "ensemble_image_client.py|gRPC, HTTP||not run: takes image files and Triton's DALI preprocessing ensemble"
)

echo "| file | protocol | result | reason when it fails |"
echo "|---|---|---|---|"
passed=0
failed=0
for entry in "${clients[@]}"; do
  IFS='|' read -r file protocol arguments not_run <<<"$entry"
  if [[ ! -f $work/clients/$file ]]; then
    echo "| \`$file\` | $protocol | absent | not in $examples |"
    continue
  fi
  if [[ -z $arguments ]]; then
    echo "| \`$file\` | $protocol | not run | ${not_run#not run: } |"
    continue
  fi
  log=$work/logs/${file%.py}-${protocol}.log
  rc=0
  # shellcheck disable=SC2086 # the arguments are words
  (cd "$work/clients" && timeout "$timeout_s" "$python" "$file" $arguments) >"$log" 2>&1 || rc=$?
  wants_pass=$(grep -c 'print("PASS' "$work/clients/$file" || true)
  if ((rc == 0)) && { ((wants_pass == 0)) || grep -q '^PASS' "$log"; }; then
    echo "| \`$file\` | $protocol | pass | |"
    passed=$((passed + 1))
  else
    # the client's own FAILED line, else gRPC's details, else its last line
    reason=$({ grep -m1 '^FAILED' "$log" || grep -m1 'details = ' "$log" || grep -v '^\s*>\?\s*$' "$log" || true; } |
      tail -n 1 | sed 's/^\s*//' | cut -c1-300 | tr '|' '/')
    ((rc == 124)) && reason="no answer within ${timeout_s} s"
    echo "| \`$file\` | $protocol | fail (exit $rc) | ${reason:-printed nothing} |"
    failed=$((failed + 1))
  fi
done
echo
echo "$passed passed, $failed failed"
if [[ ${KEEP_LOGS:-0} == 1 ]]; then
  kept=$(mktemp -d -t udfserve-triton-example-logs.XXXXXX)
  cp -r "$work/logs/." "$kept/"
  echo "logs kept in $kept"
fi
