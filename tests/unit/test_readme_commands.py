"""The README's server table and development commands say what the code does."""

from __future__ import annotations

from pathlib import Path

from udfserve.services.model_server.config import ServerConfig

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def serve_table() -> str:
    start = README.index("### `udfserve serve` configuration")
    return README[start : README.index("\n## ", start)]


def test_the_serve_table_lists_every_flag_of_udfserve_serve() -> None:
    table = serve_table()
    flags = ["--" + name.replace("_", "-") for name in ServerConfig.model_fields]
    assert [flag for flag in flags if f"`{flag}`" not in table] == []


def test_the_serve_table_lists_every_device_form_the_server_accepts() -> None:
    device_row = next(line for line in serve_table().splitlines() if line.startswith("| `--device` "))
    for form in ("`cpu`", "`gpu:N`", "`sim:N`"):
        assert form in device_row


def test_development_commands_run_the_environments_python() -> None:
    # grpcio-tools, pytest and the project are installed in .venv, which the two commands do
    # not activate: a bare `python` is another interpreter.
    commands = [line for line in README.splitlines() if "scripts/generate_protos.py" in line]
    assert commands and all(line.startswith(".venv/bin/python ") for line in commands)
