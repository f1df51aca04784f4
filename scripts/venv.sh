# shellcheck shell=bash
# Sourced by demo.sh and test.sh: create .venv if absent, make it this shell's environment,
# and install the project with the extras named in $1 ("server,tensorflow,spark"), or for "dev"
# and "bench" with every extra that runs on a CPU machine and the dependency group of that name
# (pyproject.toml), saying what is installed and how long it takes: the first install downloads
# TensorFlow and PySpark.
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $("$PYTHON" --version 2>&1) ($PYTHON)" >&2
  "$PYTHON" -m venv .venv
fi
# Spark starts its Python workers and its launcher scripts with PYSPARK_PYTHON, else the first
# python3 on PATH: both must be this environment's interpreter.
export VIRTUAL_ENV="$PWD/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export PYSPARK_PYTHON="$VIRTUAL_ENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VIRTUAL_ENV/bin/python"

# The development environment: every extra that runs without a GPU (torch and xgboost come as their CPU
# builds through the dev group), then the group's test, lint and code-generation tools.
DEV_EXTRAS="server,tensorflow,spark,kserve,native,onnx,tracing,text"
case "$1" in
  dev|bench) extras="$DEV_EXTRAS"; group="$1" ;;
  *) extras="$1"; group="" ;;
esac

# Sizes measured on Linux x86-64, Python 3.11 (docs/installing.md, "What gets installed").
case "$1" in
  server,tensorflow,spark)
    what="60 packages, about 2.9 GB: TensorFlow 1.9 GB, PySpark with its jars 491 MB, pyarrow 170 MB, pandas 79 MB, numpy 72 MB, libclang 61 MB (a TensorFlow dependency), Keras, gRPC and 49 smaller ones"
    took="a few minutes (about 3 on a 2-core machine), most of it downloading and unpacking TensorFlow and PySpark" ;;
  dev)
    what="158 packages, about 4.6 GB: what the demo installs (2.9 GB: TensorFlow, PySpark, ...), torch's CPU build (0.9 GB with sympy and networkx), ONNX Runtime, transformers, plus the test and lint tools (kubernetes-validate 110 MB, mypy 61 MB, schemathesis, grpcio-tools, ...)"
    took="a few minutes (about 5 on a busy 2-core machine; less after the demo's install), most of it downloading and unpacking TensorFlow, torch and PySpark" ;;
  *)
    what="the packages of these extras (docs/installing.md lists what each brings)"
    took="" ;;
esac
# PyTorch (the torch extra, and dev): PyPI's Linux wheel of torch is a CUDA build whose nvidia-*
# libraries are several GB. On a machine without a GPU the CPU build is installed first, from
# PyTorch's CPU index (TORCH_CPU_INDEX; pip's own indexes and find-links are searched too), and
# the project's install then finds torch there. docs/installing.md, "PyTorch".
TORCH_VERSION="2.13.0"  # the dev group's pin (pyproject.toml)
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

install_torch_cpu_build() {
  case ",$1," in *,dev,*|*,torch,*|*,bench,*) ;; *) return 0 ;; esac
  if has_gpu; then
    return 0
  fi
  if .venv/bin/python -c "import sys, torch; sys.exit(torch.__version__ != '${TORCH_VERSION}+cpu')" 2>/dev/null; then
    return 0  # the CPU build is there already
  fi
  echo "no GPU here: installing torch ${TORCH_VERSION}, the CPU build (about 190 MB to download, 0.9 GB installed), from ${TORCH_CPU_INDEX}" >&2
  .venv/bin/python -m pip install $quiet --no-deps "torch==${TORCH_VERSION}+cpu" --extra-index-url "$TORCH_CPU_INDEX"
}

warn_of_cuda_packages() {
  if has_gpu; then
    return 0
  fi
  local cuda
  cuda=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | cut -d= -f1 \
    | grep -iE '^(nvidia-|cuda-|triton$)' | grep -viE '^nvidia-ml-py$' | tr '\n' ' ' || true)
  if [ -n "$cuda" ]; then
    echo "WARNING: this machine has no GPU, yet .venv holds CUDA packages: ${cuda}(a CUDA build of torch brought them;" \
      "pip uninstall them and torch, then install torch==${TORCH_VERSION}+cpu --extra-index-url ${TORCH_CPU_INDEX})" >&2
  fi
}

# Installed once already with these extras: pip only checks them, quietly.
installing="udfserve[$extras]${group:+ with the $group group}"
stamp=".venv/.udfserve-installed-${1//,/-}"
started=$SECONDS
if [ -e "$stamp" ]; then
  echo "checking $installing in .venv (installed before)" >&2
  quiet="--quiet"
else
  echo "installing $installing into .venv: $what." >&2
  if [ -n "$took" ]; then
    echo "The first install takes $took; pip lists each package as it goes." >&2
  fi
  quiet=""
fi
.venv/bin/python -m pip install --quiet --upgrade pip
install_torch_cpu_build "$1"
# The package build compiles the native KServe front end where the system's grpc++ is (about a minute):
# only for installs that ask for it (the native extra), unless UDFSERVE_NATIVE_BUILD says otherwise.
case ",$extras," in
  *,native,*) native_build="${UDFSERVE_NATIVE_BUILD:-auto}" ;;
  *) native_build="${UDFSERVE_NATIVE_BUILD:-off}" ;;
esac
UDFSERVE_NATIVE_BUILD="$native_build" .venv/bin/python -m pip install $quiet -e ".[$extras]" ${group:+--group "$group"}
warn_of_cuda_packages
touch "$stamp"
echo "$installing is installed in .venv ($((SECONDS - started)) s)" >&2
