"""The project builds as pip builds it on every install: no build-backend deprecation notices,
and the licence declared as an SPDX expression."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib
from deploy_files import BUILD_FILES, PACKAGE_FOLDERS, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def build_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """pip's output building the project's wheel (in an isolated build environment, as an
    install does), and the wheel; built from a copy so the checkout gets no build folders."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    source.mkdir()
    for name in (*BUILD_FILES, project["project"]["readme"]):
        shutil.copy(ROOT / name, source / name)
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-cache-dir",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    [wheel] = (root / "dist").glob("udfserve-*.whl")
    return completed.stdout + completed.stderr, wheel


def test_building_the_project_prints_no_deprecation_notice(build_output: tuple[str, Path]) -> None:
    output, _ = build_output
    assert "deprecated" not in output.lower()


def test_the_licence_is_declared_as_an_spdx_expression(build_output: tuple[str, Path]) -> None:
    _, wheel = build_output
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_installs_only_the_udfserve_namespace(build_output: tuple[str, Path]) -> None:
    """A generic top-level name (``services``) would collide with a user's own package."""
    _, wheel = build_output

    top_level = {name.split("/")[0] for name in wheel_names(wheel)}

    assert {name for name in top_level if not name.endswith(".dist-info")} == {"udfserve"}


def test_every_module_of_the_folders_lands_under_the_namespace(build_output: tuple[str, Path]) -> None:
    _, wheel = build_output
    expected = {
        f"{prefix}/{path.relative_to(ROOT / folder).as_posix()}"
        for folder, prefix in PACKAGE_FOLDERS.items()
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }

    missing = expected - wheel_names(wheel)

    assert not missing, f"expected every module in the wheel; missing: {sorted(missing)}"


def test_every_installed_package_is_marked_typed(build_output: tuple[str, Path]) -> None:
    _, wheel = build_output

    marked = {name for name in wheel_names(wheel) if name.endswith("/py.typed")}

    assert marked == {f"{prefix}/py.typed" for prefix in PACKAGE_FOLDERS.values()}


def test_a_fresh_install_imports_the_namespace_and_no_services(
    build_output: tuple[str, Path], tmp_path: Path
) -> None:
    """The wheel alone in a new environment (no dependencies: the imports below load none): the
    documented names import, the card's folder names do not."""
    _, wheel = build_output
    venv.create(tmp_path / "env", with_pip=False)
    python = tmp_path / "env" / "bin" / "python"
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    check = (
        "import importlib, sys\n"
        "for name in ('udfserve', 'udfserve.spark_client', 'udfserve.services'):\n"
        "    importlib.import_module(name)\n"
        "for name in ('services', 'spark_client'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    sys.exit(f'{name} is importable')\n"
    )

    completed = subprocess.run(
        [str(python), "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r})\n{check}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr


def test_the_package_folders_are_those_setup_py_maps() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    [mapped] = [
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "MAPPED_FOLDERS" for t in node.targets)
    ]

    assert {folder: package.replace(".", "/") for folder, package in mapped.items()} == {
        folder: prefix for folder, prefix in PACKAGE_FOLDERS.items() if folder != "udfserve"
    }
