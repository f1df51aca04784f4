# Sourced by demo.sh and test.sh: create .venv if absent, make it this shell's environment,
# and install the project with the extras named in $1 (e.g. "dev").
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Spark starts its Python workers and its launcher scripts with PYSPARK_PYTHON, else the first
# python3 on PATH: both must be this environment's interpreter.
export VIRTUAL_ENV="$PWD/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export PYSPARK_PYTHON="$VIRTUAL_ENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VIRTUAL_ENV/bin/python"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[$1]"
