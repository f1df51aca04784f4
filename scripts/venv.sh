# Sourced by demo.sh and test.sh: create .venv if absent, make it this shell's environment,
# and install the project with the extras named in $1 ("server,spark" or "dev"), saying what
# is installed and how long it takes: the first install downloads TensorFlow and PySpark.
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

# Sizes measured on Linux x86-64, Python 3.11 (docs/installing.md, "What gets installed").
case "$1" in
  server,spark)
    what="60 packages, about 2.9 GB: TensorFlow 1.9 GB, PySpark with its jars 491 MB, pyarrow 170 MB, pandas 79 MB, numpy 72 MB, libclang 61 MB (a TensorFlow dependency), Keras, gRPC and 49 smaller ones"
    took="a few minutes (about 3 on a 2-core machine), most of it downloading and unpacking TensorFlow and PySpark" ;;
  dev)
    what="96 packages, about 3.2 GB: what the demo installs (2.9 GB: TensorFlow, PySpark, ...), plus the test and lint tools (kubernetes-validate 110 MB, mypy 61 MB, schemathesis, grpcio-tools, ...)"
    took="a few minutes (about 3 on a 2-core machine; less after the demo's install), most of it downloading and unpacking TensorFlow and PySpark" ;;
  *)
    what="the packages of these extras (docs/installing.md lists what each brings)"
    took="" ;;
esac
# Installed once already with these extras: pip only checks them, quietly.
stamp=".venv/.udfserve-installed-${1//,/-}"
started=$SECONDS
if [ -e "$stamp" ]; then
  echo "checking udfserve[$1] in .venv (installed before)" >&2
  quiet="--quiet"
else
  echo "installing udfserve[$1] into .venv: $what." >&2
  if [ -n "$took" ]; then
    echo "The first install takes $took; pip lists each package as it goes." >&2
  fi
  quiet=""
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install $quiet -e ".[$1]"
touch "$stamp"
echo "udfserve[$1] is installed in .venv ($((SECONDS - started)) s)" >&2
