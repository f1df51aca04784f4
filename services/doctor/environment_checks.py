"""This Python environment: which backends import, whether the native front end is built, and
whether the interpreter Spark starts its Python workers with could run the client.

A framework counts as installed when ``backend_installed`` finds it (what the server and the CPU
fallback ask), and as working when a child process imports it: a package that is present but
broken (a missing shared library, numpy built for another ABI) is found only by importing it, and
a child keeps TensorFlow's seconds and memory out of this process. The frameworks are imported in
parallel. What a missing backend costs is read from the node's repository (which models call for
it, by their files, without loading any): the CPU fallback here cannot run those models.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from udfserve.discovery import NodeDiscovery
from udfserve.runtime.backends import KNOWN_BACKENDS, backend_installed
from udfserve.runtime.model_formats import FORMAT_BY_BACKEND
from udfserve.runtime.repository import scan_repository
from udfserve.services.doctor.kserve_frontends import native_finding
from udfserve.services.doctor.report import Finding
from udfserve.spark_client.api.worker_check import interpreter_problem, worker_modules

IMPORT_TIMEOUT_S = 180.0
IMPORT_PROBE = (
    "import importlib, sys\n"
    "module = importlib.import_module(sys.argv[1])\n"
    "print(getattr(module, '__version__', ''))\n"
)
NATIVE_MODULE = "udfserve.services.model_server.frontends.kserve.native._kserve_frontend"
NATIVE_PROBE = (
    "from udfserve.services.model_server.frontends.kserve.native import load_frontend_module\n"
    "load_frontend_module()\n"
)
NEEDED_BY_NONE = "no model of the node's repository needs it"
WORKER_UDF_MODULES = ("udfserve.spark_client.executor.pandas_udf", "udfserve.spark_client.executor.arrow_udf")


def check_backends(discovery: NodeDiscovery | None, import_frameworks: bool) -> list[Finding]:
    needed, repository_note = _models_by_backend(discovery)
    installed = [name for name in KNOWN_BACKENDS if backend_installed(name)]
    children: dict[str, subprocess.Popen[str]] = {}
    if import_frameworks:
        children = {name: _start(IMPORT_PROBE, FORMAT_BY_BACKEND[name].module) for name in installed}
    native_child = _start(NATIVE_PROBE) if import_frameworks else None
    findings = []
    for name in KNOWN_BACKENDS:
        format_ = FORMAT_BY_BACKEND[name]
        models = needed.get(name, [])
        one = len(models) == 1
        names = f"model {models[0]}" if one else f"models {', '.join(models)}"
        users = f"; {names} of the node's repository need{'s' if one else ''} it" if models else ""
        them = "it" if one else "them"
        facts: dict[str, Any] = {"module": format_.module, "extra": format_.extra, "models": models}
        install = f"pip install 'udfserve[{format_.extra}]' in this environment"
        if name not in installed:
            findings.append(
                Finding(
                    group="backends",
                    name=name,
                    status="warn" if models else "info",
                    summary=f"not installed ({format_.module!r} cannot be imported)"
                    + (
                        f"{users}: the CPU fallback here cannot run {them}, and a server started here cannot "
                        f"load {them}"
                        if models
                        else f"; {repository_note or NEEDED_BY_NONE}"
                    ),
                    fix=install if models else "",
                    facts={**facts, "installed": False},
                )
            )
            continue
        if not import_frameworks:
            findings.append(
                Finding(
                    group="backends",
                    name=name,
                    status="ok",
                    summary=f"{format_.module} is installed (not imported: --no-import-frameworks){users}",
                    facts={**facts, "installed": True},
                )
            )
            continue
        ok, text = _finish(children[name])
        findings.append(
            Finding(
                group="backends",
                name=name,
                status="ok" if ok else "warn",
                summary=(
                    f"{format_.module} {text} imports{users}"
                    if ok
                    else f"{format_.module} is installed but does not import: {text}{users}"
                ),
                fix="" if ok else f"reinstall it: {install} (pip install --force-reinstall)",
                facts={**facts, "installed": True, "imports": ok, "version": text if ok else None},
            )
        )
    findings.append(_native(native_child, discovery))
    return findings


def _models_by_backend(discovery: NodeDiscovery | None) -> tuple[dict[str, list[str]], str]:
    """The node's models by the backend they call for, and why none are known when so."""
    if discovery is None or not discovery.model_repository:
        return {}, "the node's repository is not known here"
    root = Path(discovery.model_repository)
    if not root.is_dir():
        return {}, f"the node's repository {root} is not readable here"
    served = sorted({model for server in discovery.servers for model in server.models})
    try:
        scan = scan_repository(root, served)
    except OSError as exc:
        return {}, f"the node's repository {root} cannot be read here ({exc})"
    needed: dict[str, list[str]] = {}
    for model in scan.models:
        for backend in sorted({source.backend for source in model.sources if source.backend}):
            needed.setdefault(backend, []).append(model.name)
    return needed, ""


def _start(probe: str, *arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", probe, *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


def _finish(child: subprocess.Popen[str]) -> tuple[bool, str]:
    """Whether the child's import worked, and its version or the last line of its error."""
    try:
        out, err = child.communicate(timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return False, f"did not finish within {IMPORT_TIMEOUT_S:.0f} s"
    if child.returncode == 0:
        return True, out.strip()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return False, lines[-1] if lines else f"exit code {child.returncode}"


def _native(child: subprocess.Popen[str] | None, discovery: NodeDiscovery | None) -> Finding:
    if child is None:
        built = importlib.util.find_spec(NATIVE_MODULE) is not None
        ok, text = built, "" if built else "not built here"
    else:
        ok, text = _finish(child)
        text = text.split(": ", 1)[1] if text.startswith("udfserve.") and ": " in text else text
    return native_finding(ok, text, child is not None, discovery)


def check_spark_workers(environ: Mapping[str, str]) -> Finding:
    """Whether the interpreter Spark would start its Python workers with imports the client."""
    configured = environ.get("PYSPARK_PYTHON")
    executable = configured or "python3"
    source = f"PYSPARK_PYTHON={executable}" if configured else "PYSPARK_PYTHON is unset, so python3 from PATH"
    modules = tuple(dict.fromkeys(m for udf in WORKER_UDF_MODULES for m in worker_modules(udf, "arrow")))
    python_path = _worker_python_path(environ)
    problem = interpreter_problem(executable, python_path, modules)
    resolved = shutil.which(executable) or executable
    facts: dict[str, Any] = {
        "pyspark_python": configured,
        "interpreter": resolved,
        "modules": list(modules),
        "pythonpath": python_path,
    }
    if not problem:
        return Finding(
            group="spark_workers",
            name="interpreter",
            status="ok",
            summary=f"{source}{'' if resolved == executable else f' ({resolved})'} imports "
            f"{', '.join(modules)}",
            facts=facts,
        )
    fix = (
        f"set PYSPARK_PYTHON to an interpreter with udfserve's client installed (such as {sys.executable}) "
        "before the SparkSession starts, or spark.pyspark.python in the jobs"
    )
    return Finding(
        group="spark_workers",
        name="interpreter",
        status="fail" if configured else "warn",
        summary=f"Spark's Python workers would run {executable} ({source}), which {problem}"
        + ("" if configured else "; unless the jobs set spark.pyspark.python, their UDFs cannot run"),
        fix=fix,
        facts=facts,
    )


def _worker_python_path(environ: Mapping[str, str]) -> str:
    """The ``PYTHONPATH`` a Python worker gets: this one, and Spark's own archives when
    ``SPARK_HOME`` says where Spark is (PySpark comes from there on a cluster)."""
    parts = [environ.get("PYTHONPATH", "")]
    if environ.get("SPARK_HOME"):
        parts += sorted(glob.glob(os.path.join(environ["SPARK_HOME"], "python", "lib", "*.zip")))
    return os.pathsep.join(part for part in parts if part)
