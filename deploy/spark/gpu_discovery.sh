#!/usr/bin/env bash
# Spark GPU discovery script: prints the resource JSON Spark expects from
# spark.worker.resource.gpu.discoveryScript / spark.executor.resource.gpu.discoveryScript,
#   {"name": "gpu", "addresses": ["0", "1"]}
# The addresses are the GPU indices NVML and the node's model servers use (device_index in the
# udfserve discovery file), so a task assigned GPU "1" reaches the server of gpu:1.
#
# Where the ids come from, in order:
#   1. UDFSERVE_GPU_ADDRESSES, a comma- or space-separated list ("0,1"); set it to pin the ids,
#      or on machines where the model servers run on the CPU (tests, demos);
#   2. nvidia-smi --query-gpu=index;
#   3. none: an empty list (Spark then offers no GPU on this worker).
set -euo pipefail

ids=""
if [[ -n "${UDFSERVE_GPU_ADDRESSES:-}" ]]; then
  ids="${UDFSERVE_GPU_ADDRESSES//,/ }"
elif command -v nvidia-smi >/dev/null 2>&1; then
  # nvidia-smi may fail with its reason on stdout ("No devices were found"): that is no GPU, not
  # an id. Only its lines that are indices count, and only when it succeeded.
  if listed="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)"; then
    ids="$(printf '%s\n' "${listed}" | tr -d ' ' | grep -E '^[0-9]+$' | tr '\n' ' ' || true)"
  fi
fi

json=""
for id in ${ids}; do
  if [[ ! "${id}" =~ ^[0-9]+$ ]]; then
    echo "gpu_discovery.sh: GPU id '${id}' is not a non-negative integer (from UDFSERVE_GPU_ADDRESSES or nvidia-smi)" >&2
    exit 1
  fi
  json+="${json:+, }\"${id}\""
done
printf '{"name": "gpu", "addresses": [%s]}\n' "${json}"
