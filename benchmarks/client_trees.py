"""Which checkout's ``udfserve`` a ``benchmarks.worker_memory`` variant runs, and the proof of it.

``--baseline DIR`` runs ``remote_predict`` with the client of another checkout beside this one's.
Putting ``DIR`` first on the path is not enough: a checkout's ``udfserve/`` holds neither
``spark_client`` nor ``services`` (setup.py maps those folders in), and the editable install's
import hook (its ``.pth`` in site-packages) answers ``udfserve.spark_client`` from *this* checkout
for any ``udfserve`` that lacks it. And a process that has imported ``udfserve`` once (the
benchmark's own modules do) keeps it whatever its path says later. So the baseline variant's
driver and Spark workers start with a path of their own (``baseline_path``): the checkout's
folders linked under their package names (``scripts/source_tree.py``), then this checkout's
``benchmarks`` alone, no folder of this checkout's ``udfserve``; ``PYTHONSAFEPATH`` keeps
``python -m`` (the driver, PySpark's daemon) from putting its working folder first.

Each process of a variant records where its ``udfserve`` modules came from
(``benchmarks.worker_smaps.udfserve_files``), and ``check_trees`` refuses a variant whose
processes imported any of it from another place than the checkout the variant names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CLIENT_PACKAGE = "udfserve.spark_client"
NO_TREE = "no"


class WrongTreeError(RuntimeError):
    """A variant's processes imported the client of another checkout than the one it measures."""


def baseline_checkout(tree: Path) -> Path:
    """The checkout behind ``tree``: a checkout (``tree/spark_client``) or a tree of links made
    from one by ``scripts/source_tree.py`` (``tree/udfserve/spark_client``)."""
    if (tree / "spark_client").is_dir():
        return tree.resolve()
    linked = tree / "udfserve" / "spark_client"
    if linked.is_dir():
        return linked.resolve().parent
    raise ValueError(
        f"{tree} holds neither spark_client/ (a checkout) nor udfserve/spark_client "
        "(a tree of links of one, scripts/source_tree.py)"
    )


def linked_tree(tree: Path, folder: Path) -> Path:
    """``tree``'s folders under their package names (``scripts/source_tree.py``, the tree's own,
    which knows its folders, else this checkout's), for ``PYTHONPATH``; made once per folder."""
    linked = folder / f"{tree.name}-{abs(hash(str(tree)))}-tree"
    if not linked.exists():
        script = tree / "scripts" / "source_tree.py"
        if not script.exists():
            script = REPO_ROOT / "scripts" / "source_tree.py"
        subprocess.run([sys.executable, str(script), str(tree), str(linked)], check=True, capture_output=True)
    return linked


def baseline_path(checkout: Path, folder: Path) -> str:
    """``PYTHONPATH`` for the baseline variant's processes, its links made under ``folder``:
    ``checkout``'s ``udfserve`` with its mapped folders, then this checkout's ``benchmarks``."""
    client = linked_tree(checkout, folder)
    (client / "benchmarks").unlink(missing_ok=True)  # the harness is this checkout's
    harness = folder / "harness"
    harness.mkdir(parents=True, exist_ok=True)
    if not (harness / "benchmarks").exists():
        (harness / "benchmarks").symlink_to(REPO_ROOT / "benchmarks")
    return os.pathsep.join((str(client), str(harness)))


def _tree_of(path: str, trees: Mapping[str, Path]) -> str:
    """The name of the innermost of ``trees`` holding ``path`` (a baseline may lie inside this
    checkout), or ``NO_TREE``."""
    holding = [(len(root.parts), name) for name, root in trees.items() if Path(path).is_relative_to(root)]
    return max(holding)[1] if holding else NO_TREE


def check_trees(
    variant: str,
    imports: Iterable[tuple[str, Mapping[str, str]]],
    expected: str,
    trees: Mapping[str, Path],
    client_required: bool,
) -> str | None:
    """Raise ``WrongTreeError`` when a process of ``variant`` imported a ``udfserve`` module from
    anywhere but the ``expected`` of ``trees`` (``imports``: (process, ``udfserve_files()``)
    pairs), or, with ``client_required``, no client at all; else the client's file, if imported."""
    client_file = None
    for process, files in imports:
        for module, path in sorted(files.items()):
            found = _tree_of(path, trees)
            if found != expected:
                where = f"the {found} tree ({trees[found]})" if found in trees else "neither tree"
                raise WrongTreeError(
                    f"variant {variant!r}: its {process} imported {module} from {path}, in {where}, "
                    f"not the {expected} tree ({trees[expected]}); its figures would be another "
                    "client's, so none are reported"
                )
        client_file = files.get(CLIENT_PACKAGE, client_file)
    if client_required and client_file is None:
        raise WrongTreeError(f"variant {variant!r}: its Spark workers imported no {CLIENT_PACKAGE} at all")
    return client_file
