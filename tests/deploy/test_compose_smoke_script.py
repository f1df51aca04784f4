"""scripts/compose_smoke.sh, which needs root and a Docker engine, checked without running it:
bash parses it, shellcheck finds nothing where installed, and the files it names exist."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from deploy_files import ROOT

SCRIPT = ROOT / "scripts" / "compose_smoke.sh"


def test_bash_parses_the_smoke_script() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_smoke_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_files_the_smoke_script_builds_and_runs_exist() -> None:
    text = SCRIPT.read_text()
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
    text = SCRIPT.read_text()
    assert "ip link delete docker0" in text
    assert "iptables -t" in text and "-X" in text
    assert "/proc/sys/net/ipv4/ip_forward" in text
    assert "trap cleanup EXIT" in text
