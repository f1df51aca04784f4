"""``udfserve completion bash|zsh``: the script is valid shell, registers itself, and completes the
commands, the flags and the files of the real parsers."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def completion_script(shell: str, folder: Path) -> Path:
    script = subprocess.run(
        [sys.executable, "-m", "udfserve", "completion", shell],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = folder / ("udfserve.bash" if shell == "bash" else "_udfserve")
    path.write_text(script, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return completion_script("bash", tmp_path_factory.mktemp("bash"))


def complete_in_bash(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What bash offers after ``line`` (the cursor at its end), through the script's own function."""
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    program = (
        f"source {shlex.quote(str(script))}; "
        f"COMP_WORDS=({' '.join(shlex.quote(word) for word in words)}); "
        f"COMP_CWORD={len(words) - 1}; COMP_LINE={shlex.quote(line)}; COMP_POINT={len(line)}; "
        "_shtab_udfserve; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, cwd=cwd)
    return [word for word in result.stdout.splitlines() if word]


def test_the_bash_script_is_valid_bash(bash_script: Path) -> None:
    checked = subprocess.run(["bash", "-n", str(bash_script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_sourcing_the_bash_script_registers_completion_for_udfserve(bash_script: Path) -> None:
    registered = subprocess.run(
        ["bash", "-c", f"source {shlex.quote(str(bash_script))}; complete -p udfserve"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert registered.strip() == "complete -o bashdefault -F _shtab_udfserve udfserve"


def test_bash_completes_the_commands(bash_script: Path) -> None:
    assert set(complete_in_bash(bash_script, "udfserve ")) >= {
        "serve",
        "node",
        "doctor",
        "completion",
        "models",
    }
    assert complete_in_bash(bash_script, "udfserve se") == ["serve"]


def test_bash_completes_a_flag_of_serve(bash_script: Path) -> None:
    assert complete_in_bash(bash_script, "udfserve serve --max-message-b") == ["--max-message-bytes"]


@pytest.mark.parametrize("command", ["serve", "node"])
def test_bash_completes_the_tracing_flags(bash_script: Path, command: str) -> None:
    assert sorted(complete_in_bash(bash_script, f"udfserve {command} --tracing-s")) == [
        "--tracing-sample-ratio",
        "--tracing-service-name",
        "--tracing-spans-file",
    ]


def test_bash_completes_config_for_the_node(bash_script: Path) -> None:
    assert complete_in_bash(bash_script, "udfserve node --conf") == ["--config"]


def test_bash_completes_a_file_after_config(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text("devices: cpu\n", encoding="utf-8")
    assert complete_in_bash(bash_script, "udfserve node --config no", cwd=tmp_path) == ["node.yaml"]


def test_bash_completes_the_shells_of_completion(bash_script: Path) -> None:
    assert complete_in_bash(bash_script, "udfserve completion ") == ["bash", "zsh"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here")
def test_the_zsh_script_is_valid_zsh(tmp_path: Path) -> None:
    script = completion_script("zsh", tmp_path)
    checked = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert script.read_text(encoding="utf-8").startswith("#compdef udfserve")


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here")
def test_zsh_binds_the_script_to_udfserve_from_fpath(tmp_path: Path) -> None:
    completion_script("zsh", tmp_path)
    bound = subprocess.run(
        ["zsh", "-f", "-c", f"fpath=({shlex.quote(str(tmp_path))} $fpath); autoload -Uz compinit; "
         "compinit -u -D; print -r -- ${_comps[udfserve]}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert bound.strip() == "_udfserve"


def test_an_unknown_shell_is_refused_naming_the_choices() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "udfserve", "completion", "fish"], capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "argument shell: invalid choice: 'fish' (choose from" in refused.stderr
    assert "bash" in refused.stderr.splitlines()[-1] and "zsh" in refused.stderr.splitlines()[-1]


def test_without_shtab_the_command_says_what_to_install() -> None:
    # shtab comes with the server extra: an executor-only install may lack it
    program = (
        "import sys; sys.modules['shtab'] = None; from udfserve.services.cli import main; "
        "sys.exit(main(['completion', 'bash']))"
    )
    refused = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert refused.returncode == 2
    assert "udfserve completion: shell completion needs shtab, which is not installed" in refused.stderr
    assert "pip install 'udfserve[server]'" in refused.stderr
