"""Link a checkout's folders where their package names say, for tools that follow no import hook.

setup.py installs ``services/`` as ``udfserve.services`` and ``spark_client/`` as
``udfserve.spark_client``. Python finds them in an editable install through setuptools' import
hook, but mypy follows no import hook, and a second checkout (a benchmark's baseline) is not the
installed one. Both read the tree this script links instead:

    <into>/udfserve/             a folder of links to each entry of <checkout>/udfserve/
    <into>/udfserve/services     -> <checkout>/services
    <into>/udfserve/spark_client -> <checkout>/spark_client
    <into>/benchmarks            -> <checkout>/benchmarks

    python scripts/source_tree.py <checkout> <into>      # prints <into>
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

MAPPED_FOLDERS = {"services": "services", "spark_client": "spark_client"}
"""Folder of the checkout -> its name inside ``udfserve`` (setup.py's MAPPED_FOLDERS)."""


def link_tree(checkout: Path, into: Path) -> Path:
    checkout = checkout.resolve()
    if into.exists():
        shutil.rmtree(into)
    package = into / "udfserve"
    package.mkdir(parents=True)
    for entry in sorted((checkout / "udfserve").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder, name in MAPPED_FOLDERS.items():
        (package / name).symlink_to(checkout / folder)
    (into / "benchmarks").symlink_to(checkout / "benchmarks")
    return into


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} <checkout> <into>")
    print(link_tree(Path(sys.argv[1]), Path(sys.argv[2])))
