"""A check, in the driver, that Spark's Python workers can run the UDF being built.

A Python worker that lacks the client's packages fails in ways that name neither the cause nor
the fix: PySpark's own Arrow code stops at ``No module named 'pyarrow'``, or the worker cannot
unpickle the UDF at all (``No module named 'spark_client'``), long after the job started and
with no line of this package's code having run there. The common cause is an environment that
was used without being activated: the driver runs ``.venv/bin/python``, and Spark starts its
workers with ``PYSPARK_PYTHON``, else whatever ``python3`` is first on ``PATH``.

So the check runs where its message can be read, when the UDF is built. Spark's workers run
the interpreter the SparkContext recorded when it started (``SparkContext.pythonExec``: the
``PYSPARK_PYTHON`` of that moment, set by ``spark-submit`` from ``spark.pyspark.python``, else
``python3``). In local mode those workers run on this machine, in this environment, so that
interpreter is started once with the worker's ``PYTHONPATH`` and asked to import what the
worker will import. On a cluster the executors' interpreters are elsewhere and nothing is
checked: a correctly configured cluster never sees a false alarm. Nothing is started when the
workers run this very interpreter, and each answer is kept for the life of the driver.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from udfserve.spark_client.common.errors import ClientSetupError

PROBE_TIMEOUT_S = 120.0
"""Time the worker interpreter has to import the client (about half a second when it can)."""

_PROBE = """\
import importlib, sys
print("%d.%d" % sys.version_info[:2])
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        print(name)
        print(exc)
        sys.exit(3)
"""
# Prints the interpreter's version, then, for the first module that cannot be imported, its
# name and the error, exiting 3.


class WorkerEnvironmentError(ClientSetupError):
    """Spark's Python workers would start an interpreter that cannot run the UDF."""


def worker_modules(udf_module: str, protocol: str) -> tuple[str, ...]:
    """What a Python worker imports to run a UDF whose function lives in ``udf_module``."""
    modules = ["pyarrow", udf_module]
    if protocol == "kserve":
        modules.append("udfserve.spark_client.wire.kserve_transport")
    return tuple(modules)


def check_python_workers(spark: Any, modules: Sequence[str]) -> None:
    """Raise ``WorkerEnvironmentError`` when ``spark``'s local Python workers cannot import ``modules``.

    ``spark`` is the active SparkSession (None, a Spark Connect session, or a master other than
    ``local...``: nothing to check from here).
    """
    context = _spark_context(spark)
    if context is None or not str(context.master).startswith("local"):
        return
    executable = str(context.pythonExec)
    if executable == sys.executable:
        return
    failure = _probe(executable, _worker_python_path(context), tuple(modules), os.getcwd())
    if failure:
        raise WorkerEnvironmentError(_message(executable, failure))


def interpreter_problem(executable: str, python_path: str, modules: Sequence[str]) -> str:
    """Why ``executable``, started with ``python_path`` as its ``PYTHONPATH``, could not run a Python
    worker that imports ``modules`` ("" when it can): the probe of ``check_python_workers``, for a
    host checked without a SparkContext (``udfserve doctor``)."""
    return _probe(executable, python_path, tuple(modules), os.getcwd())


def _spark_context(spark: Any) -> Any:
    if spark is None:
        return None
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect sessions have no SparkContext
        return None


def _worker_python_path(context: Any) -> str:
    """The ``PYTHONPATH`` Spark gives a local Python worker: PySpark's own archives, the
    ``spark.executorEnv.PYTHONPATH`` of the job, and the one this driver's JVM inherited."""
    parts: list[str] = []
    # Not a classic JVM-backed context: the environment's own path is all there is.
    with contextlib.suppress(Exception):
        parts.append(str(context._jvm.PythonUtils.sparkPythonPath()))
    parts.append(str(context.environment.get("PYTHONPATH", "")))
    parts.append(os.environ.get("PYTHONPATH", ""))
    return os.pathsep.join(part for part in parts if part)


@functools.lru_cache(maxsize=16)
def _probe(executable: str, python_path: str, modules: tuple[str, ...], cwd: str) -> str:
    """Why ``executable`` cannot run the worker (empty when it can)."""
    resolved = shutil.which(executable)
    if resolved is None:
        return "is not an executable file, nor a command on PATH"
    env = {**os.environ, "PYTHONPATH": python_path}
    try:
        probe = subprocess.run(
            [resolved, "-c", _PROBE, *modules],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except OSError as exc:
        return f"cannot be started ({exc})"
    except subprocess.TimeoutExpired:
        return f"did not finish importing {', '.join(modules)} within {PROBE_TIMEOUT_S:.0f} s"
    lines = probe.stdout.splitlines()
    driver_version = "{}.{}".format(*sys.version_info[:2])
    if probe.returncode == 3 and len(lines) >= 3:
        return f"cannot import {lines[1]} ({lines[2]})"
    if probe.returncode != 0 or not lines:
        detail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"does not start as a Python interpreter (exit code {probe.returncode}: {detail})"
    if lines[0] != driver_version:
        return f"is Python {lines[0]}, where the driver is Python {driver_version} (PySpark needs the same)"
    return ""


def _message(executable: str, failure: str) -> str:
    resolved = shutil.which(executable) or executable
    where = "" if resolved == executable else f" ({resolved})"
    if os.environ.get("PYSPARK_PYTHON") == executable:
        source = f"PYSPARK_PYTHON={executable}"
    elif "PYSPARK_PYTHON" not in os.environ and executable == "python3":
        source = "PYSPARK_PYTHON is unset, so python3 from PATH"
    else:
        source = "the PYSPARK_PYTHON of when the SparkContext started"
    return (
        f"Spark's Python workers would run {executable}{where} ({source}), which {failure}; expected an "
        f"interpreter with udfserve's Spark client installed: set PYSPARK_PYTHON={sys.executable} (this "
        "driver's) before the SparkSession starts, or activate that environment"
    )
