"""Count a package's modules, its rooms (sub-packages) and the imports between them, from the source.

    python scripts/import_rooms.py               # the Spark client: spark_client/ as udfserve.spark_client
    python scripts/import_rooms.py DIR PACKAGE   # any folder, installed as PACKAGE
    python scripts/import_rooms.py --arrows      # and each room -> room arrow, with its module arrows

An arrow is one importing module and one imported module of the same package, counted once however
often it is imported. Every import statement counts, wherever it stands: at the top, inside a
function (the client's lazy imports), under ``TYPE_CHECKING``. ``from a import b`` is an import of
the module ``a.b`` when there is one, else of ``a``. A room is the first sub-package under the
package; the package's own modules (its ``__init__`` and any module beside it) are the room ``.``,
the package's front door. ``tests/unit/test_client_rooms.py`` holds the rooms' allowed directions
and checks that this count reads the imports the import-layer test reads.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRONT_DOOR = "."
"""The room of the package's own modules."""


def module_files(folder: Path, package: str) -> dict[str, Path]:
    """Every module under ``folder`` by its dotted name as installed under ``package``."""
    modules = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        inner = parts[:-1] if parts[-1] == "__init__" else parts
        modules[".".join([package, *inner])] = path
    return modules


def module_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Per module of the package, the modules of the same package it imports."""
    modules = module_files(folder, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [_nearest(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, own_package)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else _nearest(base, modules)
                    for alias in node.names
                ]
            else:
                continue
            graph[name].update(target for target in targets if target is not None and target != name)
    return graph


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    anchor = parts[: len(parts) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def _nearest(name: str, modules: dict[str, Path]) -> str | None:
    """The module of the package that importing ``name`` loads last: itself or its nearest parent."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def room_of(module: str, package: str, rooms: set[str]) -> str:
    """The sub-package of ``package`` that holds ``module``, or ``.`` for the package's own modules."""
    first = module.removeprefix(package + ".").split(".")[0] if module != package else ""
    return first if first in rooms else FRONT_DOOR


def rooms_of(folder: Path) -> set[str]:
    """The folder's sub-packages: its folders with an ``__init__.py``."""
    return {path.parent.name for path in folder.glob("*/__init__.py")}


def room_graph(graph: dict[str, set[str]], package: str, rooms: set[str]) -> dict[tuple[str, str], int]:
    """Per arrow between two rooms, how many module arrows it stands for."""
    arrows: Counter[tuple[str, str]] = Counter()
    for importer, imported in graph.items():
        for target in imported:
            ends = (room_of(importer, package, rooms), room_of(target, package, rooms))
            if ends[0] != ends[1]:
                arrows[ends] += 1
    return dict(arrows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "spark_client"))
    parser.add_argument("package", nargs="?", default="udfserve.spark_client")
    parser.add_argument("--arrows", action="store_true", help="list each room -> room arrow")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    rooms = rooms_of(folder)
    graph = module_graph(folder, args.package)
    between = room_graph(graph, args.package, rooms)
    inside_rooms = [room for room in sorted(rooms) if room != FRONT_DOOR]
    front_door = [module for module in graph if room_of(module, args.package, rooms) == FRONT_DOOR]
    out = sys.stdout
    out.write(
        f"{args.package}: {len(graph)} modules, {sum(map(len, graph.values()))} arrows between them; "
        f"{len(inside_rooms)} rooms and the front door ({len(front_door)} modules), "
        f"{sum(1 for ends in between if FRONT_DOOR not in ends)} arrows between rooms, "
        f"{sum(1 for ends in between if ends[0] == FRONT_DOOR)} from the front door, "
        f"{sum(1 for ends in between if ends[1] == FRONT_DOOR)} into it\n"
    )
    if args.arrows:
        for (source, target), count in sorted(between.items()):
            out.write(f"  {source} -> {target} ({count} of the module arrows)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
