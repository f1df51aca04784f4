"""Running ``udfserve doctor`` as a user runs it, and keeping what it printed.

Each run is the real command in a child process, in an environment cleared of ``UDFSERVE_*``
variables (the settings a test gives are its flags), with Spark's workers pointed at this
interpreter unless the test says otherwise. When ``DOCTOR_TRANSCRIPTS_DIR`` is set, each run
named after a case writes its command line, its output and its exit code there:
``scripts/troubleshooting_page.py`` puts them into docs/troubleshooting.md.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TRANSCRIPTS_ENV = "DOCTOR_TRANSCRIPTS_DIR"
DOCTOR_TIMEOUT_S = 240.0  # three frameworks imported at once on a busy two-core machine
WITHOUT_FILE_PERMISSION_OVERRIDE = (
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
)
"""Root without the capabilities that let it ignore file modes: it then meets a mode as any user
does, while still running the project's interpreter (which may lie in a folder only root can
read)."""
IN_ANOTHER_PID_NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc")
"""A PID namespace of its own, with its own /proc, as an executor's container has: the node's
processes are not visible from it, its files are."""


def as_user_of_file_modes() -> tuple[str, ...]:
    """The wrapper that runs a command as a user whom file modes apply to: none for a user
    other than root; root without its capabilities to override them."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run as root without its file-permission override")
    return WITHOUT_FILE_PERMISSION_OVERRIDE


def in_another_pid_namespace() -> tuple[str, ...]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a PID namespace of its own needs root and unshare (util-linux)")
    return IN_ANOTHER_PID_NAMESPACE


@dataclass(frozen=True)
class DoctorRun:
    code: int
    output: str
    errors: str

    def report(self) -> dict[str, Any]:
        """The JSON report of a run made with ``--json``."""
        loaded: dict[str, Any] = json.loads(self.output)
        return loaded

    def section(self, title: str) -> str:
        """The findings printed under ``title``, as one line (wrapping undone)."""
        lines = self.output.splitlines()
        start = lines.index(title) + 1
        end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
        return " ".join(" ".join(lines[start:end]).split())

    def line_of(self, name: str) -> str:
        """The finding of ``name`` as printed: its first line and the lines wrapped under it,
        joined into one line (the fix included)."""
        lines = self.output.splitlines()
        for index, line in enumerate(lines):
            if line[2:8].strip() in {"ok", "info", "WARN", "FAIL"} and line[8:].startswith(f"{name}: "):
                block = [line]
                for after in lines[index + 1 :]:
                    if not after.startswith(" " * 8):
                        break
                    block.append(after)
                return " ".join(part.strip() for part in block)
        raise AssertionError(f"no finding {name!r} in the report:\n{self.output}")


def run_doctor(
    case: str | None,
    arguments: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    wrapper: Sequence[str] = (),
) -> DoctorRun:
    """``udfserve doctor ARGUMENTS`` with ``env`` added to the environment, run through
    ``wrapper`` (``as_user_of_file_modes()``, ``in_another_pid_namespace()``); kept as transcript
    ``case`` when transcripts are asked for."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("UDFSERVE_")}
    given = {"PYSPARK_PYTHON": sys.executable, **(env or {})}
    environment.update(given)
    prefix = list(wrapper)
    command = [*prefix, python, "-m", "udfserve", "doctor", *arguments]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=DOCTOR_TIMEOUT_S)
    run = DoctorRun(done.returncode, done.stdout, done.stderr)
    assert run.code in (0, 1), f"udfserve doctor exited {run.code}:\n{run.output}\n{run.errors}"
    assert not run.errors.strip(), f"udfserve doctor wrote to stderr:\n{run.errors}"
    if case is not None and os.environ.get(TRANSCRIPTS_ENV):
        shown = [
            *prefix,
            *(["udfserve"] if python == sys.executable else [python, "-m", "udfserve"]),
            "doctor",
        ]
        variables = [f"{k}={shlex.quote(v)}" for k, v in given.items()]
        line = shlex.join([*shown, *arguments])
        text = f"$ {' '.join([*variables, line])}\n{run.output}$ echo $?\n{run.code}\n"
        folder = Path(os.environ[TRANSCRIPTS_ENV])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{case}.txt").write_text(text)
    return run


def environment_without(packages: Sequence[str], into: Path) -> Path:
    """A real Python environment with everything this one has installed except ``packages``
    (their modules and their metadata): a virtual environment made without pip, whose
    site-packages links to each entry of this one's. Returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(into)], check=True, timeout=120)
    source = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    [target] = list((into / "lib").glob("python*/site-packages"))
    for entry in source.iterdir():
        stem = entry.name.split("-")[0].split(".")[0].lower()
        if stem not in packages:
            (target / entry.name).symlink_to(entry)
    return into / "bin" / "python"


def bare_environment(into: Path) -> Path:
    """A virtual environment with nothing installed: what a worker's interpreter is when the
    executors' Python is not the one udfserve was installed in."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(into)], check=True, timeout=120)
    return into / "bin" / "python"
