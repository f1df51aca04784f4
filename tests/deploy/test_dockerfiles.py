"""The Dockerfiles, read line by line: pinned base images, COPY sources that exist in the build
context and are not ignored, a default command the image can really run, and the user and paths
the compose file and the Kubernetes manifests rely on.
"""

from __future__ import annotations

import fnmatch
import shutil
import sys
from pathlib import Path

import pytest
import tomllib
from deploy_files import (
    ROOT,
    Instruction,
    argv_of,
    copy_sources,
    dockerfile_instructions,
    kubernetes_object,
    load_compose,
    parse_udfserve,
)
from packaging.specifiers import SpecifierSet

import udfserve

DOCKERFILES = {
    "server": ROOT / "deploy" / "docker" / "Dockerfile.server",
    "spark": ROOT / "deploy" / "docker" / "Dockerfile.spark",
}
SHARED_UID = "10001"
SPARK_DAEMONS = {"org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"}


def instructions(image: str, keyword: str) -> list[Instruction]:
    return [i for i in dockerfile_instructions(DOCKERFILES[image]) if i.keyword == keyword]


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(relative: str) -> bool:
    for pattern in dockerignore_patterns():
        bare = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or relative.split("/")[0] == pattern or relative == bare:
            return True
    return False


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_base_image_is_named_with_a_pinned_tag(image: str) -> None:
    [base] = instructions(image, "FROM")
    name, _, tag = base.words()[0].partition(":")
    assert name and tag and tag != "latest", f"{DOCKERFILES[image]}: FROM {base.arguments}"


def test_server_image_builds_on_the_tensorflow_gpu_image_the_server_extra_accepts() -> None:
    [base] = instructions("server", "FROM")
    name, _, tag = base.words()[0].partition(":")
    assert name == "tensorflow/tensorflow" and tag.endswith("-gpu"), base.arguments
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = [r for r in project["optional-dependencies"]["server"] if r.startswith("tensorflow")]
    version = tag.removesuffix("-gpu")
    assert version in SpecifierSet(pin.removeprefix("tensorflow")), (
        f"base image TensorFlow {version} is outside the server extra's {pin}: pip would replace it"
    )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_copy_sources_exist_in_the_build_context(image: str) -> None:
    copies = instructions(image, "COPY")
    assert copies, f"{DOCKERFILES[image]} copies nothing"
    for copy in copies:
        where = f"{DOCKERFILES[image].name}:{copy.line}"
        for source in copy_sources(copy):
            assert (ROOT / source).exists(), f"{where}: COPY source {source} is missing"
            assert not ignored(source), f"{where}: COPY source {source} is excluded by .dockerignore"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_copied_sources_hold_every_installed_package(image: str) -> None:
    """pip installs from the copy: every package the project declares must be in it."""
    copied = {source for copy in instructions(image, "COPY") for source in copy_sources(copy)}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.removesuffix("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied
    assert {"pyproject.toml", project["project"]["readme"]} <= copied


def test_server_image_runs_the_node_supervisor_by_default() -> None:
    [cmd] = instructions("server", "CMD")
    args = parse_udfserve(cmd.words())
    assert args.command == "node"
    assert not instructions("server", "ENTRYPOINT"), "compose and Kubernetes give full commands"


def test_spark_image_runs_a_spark_daemon_the_pip_installed_pyspark_ships() -> None:
    [cmd] = instructions("spark", "CMD")
    program, main_class = cmd.words()[:2]
    assert main_class in SPARK_DAEMONS
    assert program == "spark-class"
    assert shutil.which(program, path=str(Path(sys.executable).parent)), (
        "pip-installed PySpark ships spark-class next to the interpreter"
    )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_images_run_as_the_shared_unprivileged_user(image: str) -> None:
    [user] = instructions(image, "USER")
    assert user.arguments == "udfserve"
    [create] = [r for r in instructions(image, "RUN") if "useradd" in r.arguments]
    assert f"--uid {SHARED_UID}" in create.arguments and f"--gid {SHARED_UID}" in create.arguments


def test_kubernetes_runs_the_node_as_the_image_user() -> None:
    security = kubernetes_object("DaemonSet")["spec"]["template"]["spec"]["securityContext"]
    assert str(security["runAsUser"]) == SHARED_UID and str(security["runAsGroup"]) == SHARED_UID


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_runtime_and_model_folders_exist_in_the_image_with_the_user_as_owner(image: str) -> None:
    """Named volumes mounted on them take their owner from the image."""
    [create] = [r for r in instructions(image, "RUN") if "useradd" in r.arguments]
    assert "/run/udfserve" in create.arguments and "/models" in create.arguments
    assert "chown udfserve:udfserve" in create.arguments


def test_images_default_the_runtime_folder_where_compose_mounts_it() -> None:
    for image in DOCKERFILES:
        env = " ".join(i.arguments for i in instructions(image, "ENV"))
        assert "UDFSERVE_RUNTIME_DIR=/run/udfserve" in env, image


@pytest.mark.parametrize("name", ["models", "udfserve-node", "udfserve-node-cpu", "spark-master", "demo"])
def test_compose_builds_images_tagged_with_the_package_version(name: str) -> None:
    service = load_compose()["services"][name]
    repository, _, tag = service["image"].partition(":")
    version = udfserve.__version__
    assert tag == version, f"{name} uses {service['image']}; the package is {version}"
    dockerfile = Path(service["build"]["dockerfile"]).name
    assert repository == f"udfserve/{dockerfile.removeprefix('Dockerfile.')}"


def test_kubernetes_uses_the_server_image_compose_builds() -> None:
    compose_image = load_compose()["services"]["udfserve-node"]["image"]
    spec = kubernetes_object("DaemonSet")["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert images == {compose_image}


def test_kubernetes_init_container_commands_are_real() -> None:
    spec = kubernetes_object("DaemonSet")["spec"]["template"]["spec"]
    for container in spec["containers"] + spec["initContainers"]:
        argv = argv_of(container["command"])
        if argv[0] == "udfserve":
            parse_udfserve(argv)
