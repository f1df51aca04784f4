"""deploy/spark/gpu_discovery.sh, run as Spark runs it: the resource JSON, or an empty list when
nvidia-smi finds no GPU; the Spark image holds it where spark-defaults.conf names it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path, PurePosixPath

import pytest
from deploy_files import ROOT, copy_sources, dockerfile_instructions

SCRIPT = ROOT / "deploy" / "spark" / "gpu_discovery.sh"


def discover(
    tmp_path: Path, nvidia_smi: str | None = None, addresses: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The script with only a fake ``nvidia-smi`` (a shell body) on PATH besides the basics."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if addresses is not None:
        env["UDFSERVE_GPU_ADDRESSES"] = addresses
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=30)


def test_pinned_addresses_are_the_resource_json(tmp_path: Path) -> None:
    found = discover(tmp_path, addresses="0, 1")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {"name": "gpu", "addresses": ["0", "1"]}


def test_the_gpus_nvidia_smi_lists_are_the_addresses(tmp_path: Path) -> None:
    found = discover(tmp_path, nvidia_smi="printf '0\\n1\\n'")
    assert json.loads(found.stdout) == {"name": "gpu", "addresses": ["0", "1"]}


@pytest.mark.parametrize("failure", ["echo 'No devices were found'; exit 6", "exit 9"])
def test_a_failing_nvidia_smi_means_no_gpu_not_a_failed_worker(tmp_path: Path, failure: str) -> None:
    found = discover(tmp_path, nvidia_smi=failure)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {"name": "gpu", "addresses": []}


def test_a_pinned_address_that_is_not_an_index_is_refused_naming_it(tmp_path: Path) -> None:
    found = discover(tmp_path, addresses="gpu0")
    assert found.returncode == 1
    assert "GPU id 'gpu0' is not a non-negative integer" in found.stderr


def test_the_spark_image_holds_the_script_where_spark_defaults_names_it() -> None:
    conf = (ROOT / "deploy" / "spark" / "spark-defaults.conf").read_text().splitlines()
    named = {
        line.split()[1] for line in conf if line.strip().startswith("spark.") and "discoveryScript" in line
    }
    assert named == {"/opt/udfserve/deploy/spark/gpu_discovery.sh"}
    # Where the COPY puts it: its destination, relative to the WORKDIR in force.
    workdir = PurePosixPath("/")
    copied_to = set()
    for instruction in dockerfile_instructions(ROOT / "deploy" / "docker" / "Dockerfile.spark"):
        if instruction.keyword == "WORKDIR":
            workdir = workdir / instruction.arguments
        elif instruction.keyword == "COPY" and "deploy/spark/gpu_discovery.sh" in copy_sources(instruction):
            copied_to.add(str(workdir / instruction.words()[-1]))
    assert copied_to == named
    assert os.access(SCRIPT, os.X_OK)
