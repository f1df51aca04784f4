"""What each install of udfserve brings: packages and disk, for docs/installing.md.

    python scripts/install_sizes.py                       # the table of the usual installs
    python scripts/install_sizes.py server server,tensorflow 'spark+group:dev'

pip resolves each install afresh (``pip install --dry-run --ignore-installed --report``, as on a
machine with nothing installed), and each resolved distribution is then measured as it is
installed in this environment: the sum of the sizes its RECORD lists, which is what ``du`` of
its files in ``site-packages`` says, give or take blocks. A distribution the resolution names
but this environment lacks is listed as not measured, so a figure is never a guess. Run it in the
development environment (``scripts/test.sh`` makes it), which holds every extra's packages.

An install is written as pip's extras, comma-separated, then optionally ``+group:NAME`` for a
dependency group of pyproject.toml (PEP 735; pip 25.1 or newer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INSTALLS = (
    "",
    "kserve",
    "spark",
    "server",
    "server,onnx",
    "server,tensorflow",
    "spark,fallback",
    "server,tensorflow,spark",
    "+group:dev",
)
MIB = 1024 * 1024


@dataclass(frozen=True)
class InstallSize:
    install: str
    packages: int
    size_bytes: int
    largest: tuple[tuple[str, int], ...]
    not_measured: tuple[str, ...]


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _installed_sizes() -> dict[str, int]:
    """Bytes on disk of every distribution in this environment, by canonical name."""
    sizes: dict[str, int] = {}
    for distribution in metadata.distributions():
        total = 0
        for file in distribution.files or ():
            if file.size is not None:
                total += file.size
            else:  # RECORD leaves its own size (and the .pyc files') out: ask the file system
                path = Path(str(file.locate()))
                total += path.stat().st_size if path.is_file() else 0
        sizes[_canonical(distribution.metadata["Name"])] = total
    return sizes


def resolve(install: str) -> list[str]:
    """The distributions pip would install for ``install`` into an empty environment."""
    extras, _, group = install.partition("+group:")
    target = f".[{extras}]" if extras else "."
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    with tempfile.TemporaryDirectory() as folder:
        report_path = Path(folder) / "report.json"
        command += ["--report", str(report_path), target]
        if group:
            command += ["--group", group]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"pip cannot resolve {target} {group}: {result.stderr.strip()[-2000:]}")
        report = json.loads(report_path.read_text())
    names = [_canonical(item["metadata"]["name"]) for item in report["install"]]
    return [name for name in names if name != "udfserve"]


def measure(install: str, installed: dict[str, int]) -> InstallSize:
    names = resolve(install)
    measured = {name: installed[name] for name in names if name in installed}
    largest = tuple(sorted(measured.items(), key=lambda item: -item[1])[:4])
    return InstallSize(
        install=install,
        packages=len(names),
        size_bytes=sum(measured.values()),
        largest=largest,
        not_measured=tuple(sorted(set(names) - set(measured))),
    )


def label(install: str) -> str:
    extras, _, group = install.partition("+group:")
    text = f"`udfserve[{extras}]`" if extras else "`udfserve`"
    return f"{text} with the `{group}` group" if group else text


def table(sizes: list[InstallSize]) -> str:
    lines = ["| install | packages | disk | largest |", "|---|---|---|---|"]
    for size in sizes:
        largest = ", ".join(f"{name} {value / MIB:,.0f}" for name, value in size.largest)
        missing = f" (not here, not counted: {', '.join(size.not_measured)})" if size.not_measured else ""
        disk = f"{size.size_bytes / MIB:,.0f} MiB{missing}"
        lines.append(f"| {label(size.install)} | {size.packages} | {disk} | {largest} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "installs",
        nargs="*",
        default=list(DEFAULT_INSTALLS),
        help="extras, comma-separated, optionally +group:NAME (default: the usual installs)",
    )
    args = parser.parse_args(argv)
    installed = _installed_sizes()
    sys.stdout.write(table([measure(install, installed) for install in args.installs]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
