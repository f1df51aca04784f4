"""Which modules of ``udfserve`` import which, read from the source.

The folders ``services/`` and ``spark_client/`` install as ``udfserve.services`` and
``udfserve.spark_client`` (setup.py); the rest of ``udfserve`` (the folder ``udfserve/``) is the
shared layer.

Every import statement counts wherever it stands: at the top of a module, inside a function (the
lazy imports of the CPU fallback and of the backends), or under ``TYPE_CHECKING``. ``from a
import b`` counts as an import of the module ``a.b`` when there is one, else of ``a``; relative
imports are resolved against the importing module's package.

The layers: the shared layer imports neither side (nor ``tritonclient``, which only the KServe
client's two modules import: the server speaks KServe through ``udfserve.protocol.kserve``, and
``udfserve.services`` never imports it); ``udfserve.spark_client`` never imports
``udfserve.services`` (its CPU fallback runs ``udfserve.runtime``, as the server does); in the
model server, the request core (``core/``) imports no front end (``frontends/``) and the metrics
(``observability/``) import neither; and no module takes part in an import cycle.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = "udfserve.services"
CLIENT = "udfserve.spark_client"
SHARED = "udfserve"
"""The shared layer: the package ``udfserve`` less the two mapped into it and ``python -m udfserve``."""
COMMAND = "udfserve.__main__"
PACKAGES = {"udfserve": SHARED, "services": SERVICES, "spark_client": CLIENT}
"""Folder of the repository -> the package it installs as."""

KNOWN_CYCLES: set[frozenset[str]] = set()
"""Cycles as the sets of modules that form them; each must still exist, so fixing one means
removing it here."""


@dataclass(frozen=True)
class Import:
    """One import statement's target: ``name`` as written (made absolute), ``module`` the module of
    the tree it resolves to (None for anything outside the tree)."""

    importer: str
    name: str
    module: str | None
    line: int


def module_files(root: Path, packages: Mapping[str, str]) -> dict[str, Path]:
    """Every module of the folders of ``packages`` under ``root`` by its dotted name (a package by
    its own), each folder named as the package it installs as."""
    modules = {}
    for folder, package in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            inner = parts[:-1] if parts[-1] == "__init__" else parts
            modules[".".join([package, *inner])] = path
    return modules


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> list[Import]:
    """Every import in the module's source, wherever it stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(name, alias.name, _known(alias.name, modules), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}" if base else alias.name
                if submodule in modules:
                    found.append(Import(name, submodule, submodule, node.lineno))
                else:
                    found.append(Import(name, base, _known(base, modules), node.lineno))
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    anchor = parts[: len(parts) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module of the tree that ``import name`` loads last: ``name`` or its nearest parent."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Per module, the modules of the tree it imports, each with the line of its first import."""
    modules = module_files(root, packages)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        for found in imports_of(name, path, modules):
            if found.module is not None and found.module != name:
                graph[name].setdefault(found.module, found.line)
    return graph


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def shortest_cycle(graph: Mapping[str, Mapping[str, int]], component: frozenset[str]) -> str:
    """One shortest cycle through the component, as ``a -> b (line 3) -> a (line 9)``."""
    best: list[str] = []
    for start in sorted(component):
        came_from: dict[str, str] = {}
        queue = deque([start])
        while queue and start not in came_from:
            module = queue.popleft()
            for target in sorted(graph[module]):
                if target in component and target not in came_from:
                    came_from[target] = module
                    queue.append(target)
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(came_from[path[-1]])
        path.reverse()
        if not best or len(path) < len(best):
            best = path
    steps = [best[0]] + [f"{b} (line {graph[a][b]} of {a})" for a, b in itertools.pairwise(best)]
    return " -> ".join(steps)


def _within(name: str, packages: Iterable[str]) -> bool:
    return any(_in_package(name, package) for package in packages)


def _in_package(name: str, package: str) -> bool:
    inside = name == package or name.startswith(package + ".")
    if package == SHARED:
        mapped = any(_in_package(name, package) for package in (SERVICES, CLIENT))
        return inside and name != COMMAND and not mapped
    return inside


def imports_from(importers: str, imported: Iterable[str]) -> list[str]:
    """Imports by modules of the package ``importers`` (dotted) of anything in the packages
    ``imported`` (dotted)."""
    modules = module_files(ROOT, PACKAGES)
    forbidden = tuple(imported)
    found = {
        (statement.importer, statement.line, statement.name)
        for name, path in modules.items()
        if _within(name, [importers])
        for statement in imports_of(name, path, modules)
        if _within(statement.name, forbidden)
    }
    return [f"{importer} (line {line}) imports {name}" for importer, line, name in sorted(found)]


def test_no_module_of_the_three_packages_is_part_of_an_unknown_import_cycle() -> None:
    graph = import_graph(ROOT, PACKAGES)

    unknown = [component for component in cycles(graph) if component not in KNOWN_CYCLES]

    assert not unknown, "import cycles (expected none; each module imports the next):\n" + "\n".join(
        f"{shortest_cycle(graph, component)}; modules importing each other: {sorted(component)}"
        for component in unknown
    )


def test_every_known_cycle_still_exists() -> None:
    found = set(cycles(import_graph(ROOT, PACKAGES)))

    gone = [sorted(cycle) for cycle in KNOWN_CYCLES if cycle not in found]

    assert not gone, f"expected every cycle of KNOWN_CYCLES to exist; these are gone, remove them: {gone}"


def test_spark_client_imports_nothing_of_services() -> None:
    found = imports_from(CLIENT, [SERVICES])

    assert not found, "expected no import of services in spark_client:\n" + "\n".join(found)


def test_the_shared_layer_imports_neither_services_nor_spark_client() -> None:
    found = imports_from(SHARED, [SERVICES, CLIENT])

    assert not found, "expected no import of services or spark_client in the shared layer:\n" + "\n".join(
        found
    )


def test_the_shared_layer_never_imports_tritonclient() -> None:
    """The shared layer runs in every executor; ``tritonclient`` is the KServe extra's, not the base's."""
    found = imports_from(SHARED, ["tritonclient"])

    assert not found, "expected no import of tritonclient in udfserve:\n" + "\n".join(found)


def test_the_server_side_never_imports_tritonclient() -> None:
    """The ``server`` extra does not install ``tritonclient``: its KServe front ends, statistics and
    native build use the protocol generated from ``protos/`` (``udfserve.protocol.kserve``)."""
    found = imports_from(SERVICES, ["tritonclient"])

    assert not found, "expected no import of tritonclient in services:\n" + "\n".join(found)


KSERVE_CLIENT_MODULES = {
    "udfserve.spark_client.wire.kserve_transport",
    "udfserve.spark_client.wire.kserve_messages",
}


def test_in_spark_client_only_the_kserve_wire_and_its_messages_import_tritonclient() -> None:
    found = [
        line
        for line in imports_from(CLIENT, ["tritonclient"])
        if line.split()[0] not in KSERVE_CLIENT_MODULES
    ]

    assert not found, (
        f"expected tritonclient imported in spark_client only by {sorted(KSERVE_CLIENT_MODULES)}:\n"
        + "\n".join(found)
    )


SERVER = f"{SERVICES}.model_server"


def test_the_servers_request_core_imports_no_front_end() -> None:
    """Front ends decode and encode around the core; the core knows none of them."""
    found = imports_from(f"{SERVER}.core", [f"{SERVER}.frontends"])

    assert not found, "expected no import of a front end in the request core:\n" + "\n".join(found)


def test_the_servers_observability_imports_no_front_end_and_no_request_lifecycle() -> None:
    found = imports_from(
        f"{SERVER}.observability",
        [f"{SERVER}.frontends", f"{SERVER}.core.request_lifecycle", f"{SERVER}.core.batching"],
    )

    assert not found, "expected metrics to depend on nothing that reports to them:\n" + "\n".join(found)


def test_the_walk_sees_lazy_relative_and_type_checking_imports_and_prints_a_cycle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from . import c\n"
    )
    (package / "sub" / "c.py").write_text("import os\n\nfrom ..a import f\n")

    graph = import_graph(tmp_path, {"pkg": "pkg"})

    assert graph["pkg.a"] == {"pkg.sub.b": 2}
    assert graph["pkg.sub.b"] == {"pkg.sub.c": 4}
    assert graph["pkg.sub.c"] == {"pkg.a": 3}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.sub.b", "pkg.sub.c"})]
    assert shortest_cycle(graph, cycles(graph)[0]) == (
        "pkg.a -> pkg.sub.b (line 2 of pkg.a) -> pkg.sub.c (line 4 of pkg.sub.b) "
        "-> pkg.a (line 3 of pkg.sub.c)"
    )


def test_nothing_imports_a_folder_by_its_card_name() -> None:
    """``services`` and ``spark_client`` install as ``udfserve.services`` and ``udfserve.spark_client``;
    a bare ``import services`` works only from the repository's root, and would load a second copy of
    each module under another name."""
    folders = ("udfserve", "services", "spark_client", "tests", "benchmarks", "scripts")
    bare = {"services", "spark_client"}
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                names = (
                    [alias.name for alias in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                found += [
                    f"{path.relative_to(ROOT)} (line {node.lineno}) imports {name}"
                    for name in names
                    if name.split(".")[0] in bare
                ]

    assert not found, "expected imports of udfserve.services and udfserve.spark_client only:\n" + "\n".join(
        found
    )
