#!/usr/bin/env bash
# Build the native KServe front end (--kserve-frontend native) into the installed package.
# It compiles against the system's grpc++ and protobuf: when they are missing and this shell may
# install Debian packages (root, or sudo without a password), they are installed first. The package
# build (pip install) compiles it too where they are present; this script is for a machine where they
# were not, and skips a build that is up to date.
# Run by scripts/test.sh; by hand: bash scripts/native.sh (after scripts/venv.sh has made .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(libgrpc++-dev libprotobuf-dev protobuf-compiler pkg-config g++)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "the native KServe front end needs the system packages ${missing[*]}; install them, then rerun" >&2
    exit 1
  fi
  echo "installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { "${as_root[@]}" apt-get update -q >/dev/null && \
         "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi
.venv/bin/python -m udfserve.services.model_server.frontends.kserve.native.build
