"""``udfserve doctor``: run every check, print the report, exit 1 when something blocks jobs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TextIO

from udfserve.node_files import trusted_uids
from udfserve.services.doctor.config import DoctorConfig
from udfserve.services.doctor.environment_checks import check_backends, check_spark_workers
from udfserve.services.doctor.host_checks import check_gpus, check_shared_memory
from udfserve.services.doctor.node_checks import check_node
from udfserve.services.doctor.render import render_json, render_text
from udfserve.services.doctor.report import Finding, Report
from udfserve.services.doctor.server_checks import check_servers
from udfserve.services.doctor.token_checks import check_token, read_token
from udfserve.services.settings_cli import add_settings_arguments, settings_from_args

DESCRIPTION = (
    "Check, on a node or in an executor's environment, what jobs need from this host, and explain each "
    "problem with its fix: the discovery file (present, trusted, fresh, its supervisor alive), each "
    "server (health, models and the versions that serve), the unix sockets (reachable from this user), "
    "the token, the shared-memory folder (mode, owner, free space), NVML and the GPUs, "
    "CUDA_VISIBLE_DEVICES, the backends that import here and the native front end, and the interpreter "
    "Spark starts its Python workers with (PYSPARK_PYTHON). Exit code 1 when something blocks jobs, 0 "
    "otherwise (warnings included), 2 for invalid settings. docs/troubleshooting.md shows each problem."
)


def add_doctor_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check this node and this environment, and say how to fix each problem",
        description=DESCRIPTION,
    )
    add_settings_arguments(doctor, DoctorConfig)
    doctor.add_argument("--json", action="store_true", help="print the report as JSON, for scripts")
    doctor.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from udfserve.services.process_setup import configure_logging

    configure_logging("ERROR")  # the report says everything; the checked code's own warnings would repeat it
    config = settings_from_args(DoctorConfig, args)
    report = examine(config, os.environ)
    write(report, args.json, sys.stdout)
    return report.exit_code


def examine(config: DoctorConfig, environ: Mapping[str, str]) -> Report:
    """Every check, in the order of the report."""
    findings: list[Finding] = []
    node_findings, discovery = check_node(config, environ)
    findings += node_findings
    metadata, token_problem = read_token(config)
    if discovery is not None:
        trusted = trusted_uids(config.trusted_node_uids)
        server_findings, answers = check_servers(
            discovery, config.runtime_folder, trusted, metadata, config.timeout_s
        )
        findings += server_findings
        findings.append(token_problem or check_token(config, metadata, answers))
    elif token_problem is not None:
        findings.append(token_problem)
    findings += check_shared_memory(config)
    findings += check_gpus(environ, discovery)
    findings += check_backends(discovery, config.import_frameworks)
    findings.append(check_spark_workers(environ))
    return Report(findings=findings)


def write(report: Report, as_json: bool, out: TextIO) -> None:
    out.write(render_json(report) if as_json else render_text(report))
