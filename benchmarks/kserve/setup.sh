#!/usr/bin/env bash
# Set up the two heavy peers of the KServe benchmark, outside the project's environment:
#   - a real Triton Inference Server: the nvidia-pytriton wheel bundles tritonserver with its
#     python backend; it needs numpy<2, so it gets a virtual environment of its own, with
#     TensorFlow to run the same Keras model inside the backend's model.py;
#   - perf_analyzer: the binary shipped inside the tritonclient 2.48.0 wheel (extracted, that
#     old client is not installed), with Debian's libb64 and the libcudart that pytriton bundles.
#
#   bash benchmarks/kserve/setup.sh            # idempotent; prints the environment file it wrote
#
# Everything goes under $UDFSERVE_KSERVE_BENCH_DIR (default: ~/.cache/udfserve/kserve-bench).
set -euo pipefail

BENCH_DIR="${UDFSERVE_KSERVE_BENCH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/udfserve/kserve-bench}"
PYTHON="${PYTHON:-python3.11}"
PYTRITON_VERSION="${PYTRITON_VERSION:-0.5.14}"
PERF_ANALYZER_WHEEL_VERSION="2.48.0"

mkdir -p "$BENCH_DIR/bin" "$BENCH_DIR/wheels"
TRITON_VENV="$BENCH_DIR/triton-venv"

if [ ! -x "$TRITON_VENV/bin/python" ]; then
  "$PYTHON" -m venv "$TRITON_VENV"
fi
"$TRITON_VENV/bin/pip" install --quiet --upgrade pip
"$TRITON_VENV/bin/pip" install --quiet "nvidia-pytriton==$PYTRITON_VERSION" "numpy<2" "tensorflow>=2.18,<2.22"

PERF_ANALYZER="$BENCH_DIR/bin/perf_analyzer"
if [ ! -x "$PERF_ANALYZER" ]; then
  "$TRITON_VENV/bin/pip" download --quiet --no-deps "tritonclient==$PERF_ANALYZER_WHEEL_VERSION" \
    --platform manylinux1_x86_64 --only-binary=:all: -d "$BENCH_DIR/wheels"
  wheel="$(ls "$BENCH_DIR"/wheels/tritonclient-"$PERF_ANALYZER_WHEEL_VERSION"-*.whl | head -n 1)"
  "$TRITON_VENV/bin/python" - "$wheel" "$PERF_ANALYZER" <<'PY'
import sys, zipfile, os, shutil
wheel, target = sys.argv[1], sys.argv[2]
member = "tritonclient-2.48.0.data/data/bin/perf_analyzer"
with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as sink:
    shutil.copyfileobj(source, sink)
os.chmod(target, 0o755)
PY
fi

if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  if [ "$(id -u)" = 0 ]; then
    apt-get install -y -q libb64-0d >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q libb64-0d >/dev/null; }
  else
    echo "perf_analyzer needs Debian's libb64-0d: run 'sudo apt-get install libb64-0d'" >&2
    exit 1
  fi
fi

SITE_PACKAGES="$("$TRITON_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PYTRITON_LIBS="$SITE_PACKAGES/nvidia_pytriton.libs"
DIST="$SITE_PACKAGES/pytriton/tritonserver"
PY_VERSION="$("$TRITON_VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"

# A copy of the server with the backend stub of this Python version in place, as pytriton
# prepares it at run time; its libraries (auditwheel-renamed) come from LD_LIBRARY_PATH.
TRITON_HOME="$BENCH_DIR/tritonserver"
rm -rf "$TRITON_HOME"
mkdir -p "$TRITON_HOME"
cp -r "$DIST/bin" "$DIST/backends" "$TRITON_HOME/"
cp "$DIST/python_backend_stubs/$PY_VERSION/triton_python_backend_stub" "$TRITON_HOME/backends/python/"

# perf_analyzer asks for libcudart.so.12 by its plain name; the wheel's copy is renamed.
CUDART="$(find "$PYTRITON_LIBS" -name 'libcudart*.so.12*' -print -quit)"
if [ -z "$CUDART" ]; then
  echo "no libcudart.so.12 in $PYTRITON_LIBS; perf_analyzer cannot start without it" >&2
  exit 1
fi
mkdir -p "$BENCH_DIR/lib"
ln -sf "$CUDART" "$BENCH_DIR/lib/libcudart.so.12"
# The backend stub links libpython: it must be the one of the interpreter the environment was made from.
LIBPYTHON_DIR="$("$TRITON_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"

cat > "$BENCH_DIR/env.sh" <<ENV
# Written by benchmarks/kserve/setup.sh
KSERVE_BENCH_DIR="$BENCH_DIR"
TRITON_SITE_PACKAGES="$SITE_PACKAGES"
TRITONSERVER="$TRITON_HOME/bin/tritonserver"
TRITON_BACKEND_DIR="$TRITON_HOME/backends"
TRITON_LD_LIBRARY_PATH="$LIBPYTHON_DIR:$PYTRITON_LIBS"
PERF_ANALYZER="$PERF_ANALYZER"
PERF_ANALYZER_LD_LIBRARY_PATH="$BENCH_DIR/lib"
ENV
LD_LIBRARY_PATH="$BENCH_DIR/lib" "$PERF_ANALYZER" --version >/dev/null 2>&1 || {
  echo "perf_analyzer does not start: LD_LIBRARY_PATH=$BENCH_DIR/lib $PERF_ANALYZER --version" >&2
  exit 1
}
echo "$BENCH_DIR/env.sh"
