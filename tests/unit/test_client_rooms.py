"""The Spark client's rooms, and which way their imports may go.

``spark_client/`` (``udfserve.spark_client``) is six sub-packages, each one kind of code, and a
front door (the package's ``__init__`` and the two module paths the documentation gives users). An
import may go down this list and never up it:

    .              the front door: the public names, resolved lazily
    api            the public UDFs, and what the driver checks while it builds one
    executor       what runs in a Spark task: the UDFs' functions, a partition, the CPU fallback
    nodes          which server a task talks to; the node servers a job starts itself
    observability  the job's context on every request, the trace header, a task's counters
    wire           gRPC to a server: the stream, the protocols, channels, credentials
    common         the settings a UDF carries, the model's spec, the errors

``nodes`` and ``observability`` do not import each other, nor does ``nodes`` import ``wire``: finding
or starting a node never speaks to a model server. The imports are read as
``scripts/import_rooms.py`` reads them, lazy ones and those under ``TYPE_CHECKING`` included; that
script prints the counts that docs/architecture.md gives.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from test_import_layers import CLIENT, PACKAGES, import_graph

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "spark_client"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_rooms", ROOT / "scripts" / "import_rooms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_rooms", module)
    spec.loader.exec_module(module)
    return module


rooms_script = _script()
FRONT_DOOR = rooms_script.FRONT_DOOR

MAY_IMPORT: dict[str, set[str]] = {
    FRONT_DOOR: {"api", "executor", "nodes", "observability", "wire", "common"},
    "api": {"executor", "nodes", "observability", "wire", "common"},
    "executor": {"nodes", "observability", "wire", "common"},
    "nodes": {"common"},
    "observability": {"wire", "common"},
    "wire": {"common"},
    "common": set(),
}
"""Each room, and the rooms it may import."""


def _arrows() -> dict[tuple[str, str], int]:
    graph = rooms_script.module_graph(FOLDER, CLIENT)
    return rooms_script.room_graph(graph, CLIENT, rooms_script.rooms_of(FOLDER))


def _module_arrows(source: str, target: str) -> list[str]:
    """The imports from modules of room ``source`` of modules of room ``target``."""
    graph = rooms_script.module_graph(FOLDER, CLIENT)
    rooms = rooms_script.rooms_of(FOLDER)
    return sorted(
        f"{importer} imports {imported}"
        for importer, targets in graph.items()
        for imported in targets
        if rooms_script.room_of(importer, CLIENT, rooms) == source
        and rooms_script.room_of(imported, CLIENT, rooms) == target
    )


def test_the_client_has_exactly_the_rooms_named_here() -> None:
    assert rooms_script.rooms_of(FOLDER) | {FRONT_DOOR} == set(MAY_IMPORT)


def test_every_import_between_rooms_goes_a_way_this_test_allows() -> None:
    wrong = [
        line
        for source, target in sorted(_arrows())
        if target not in MAY_IMPORT[source]
        for line in _module_arrows(source, target)
    ]

    assert not wrong, (
        "expected each room to import only the rooms of MAY_IMPORT; move the module, or the code it "
        "needs, into a room below:\n" + "\n".join(wrong)
    )


def test_the_allowed_directions_have_no_cycle() -> None:
    """A cycle in the allowed directions would let two rooms import each other."""
    order: list[str] = []
    left = dict(MAY_IMPORT)
    while left:
        ready = [room for room, below in left.items() if below <= set(order)]
        assert ready, f"expected the rooms to form no cycle; these import each other: {sorted(left)}"
        order += sorted(ready)
        for room in ready:
            del left[room]

    assert order[0] == "common" and order[-1] == FRONT_DOOR


def test_the_front_door_holds_only_the_package_and_its_two_documented_module_paths() -> None:
    rooms = rooms_script.rooms_of(FOLDER)
    graph = rooms_script.module_graph(FOLDER, CLIENT)

    front_door = {module for module in graph if rooms_script.room_of(module, CLIENT, rooms) == FRONT_DOOR}

    assert front_door == {CLIENT, f"{CLIENT}.tracing", f"{CLIENT}.kserve_messages"}


def test_the_script_reads_the_imports_the_import_layer_test_reads() -> None:
    """Two readers of the same source; the counts in docs/architecture.md come from the script."""
    layers = import_graph(ROOT, PACKAGES)
    client_only = {
        module: {target for target in targets if target == CLIENT or target.startswith(CLIENT + ".")}
        for module, targets in layers.items()
        if module == CLIENT or module.startswith(CLIENT + ".")
    }

    assert rooms_script.module_graph(FOLDER, CLIENT) == client_only


def test_the_script_counts_rooms_and_arrows_of_a_small_package(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for room in ("low", "high"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text('"""A room."""\n')
    (package / "__init__.py").write_text("from pkg.high import a\n")
    (package / "low" / "b.py").write_text("import os\n")
    (package / "low" / "c.py").write_text("from . import b\n")
    (package / "high" / "a.py").write_text("def f():\n    from ..low import b, c\n")

    graph = rooms_script.module_graph(package, "pkg")
    arrows = rooms_script.room_graph(graph, "pkg", rooms_script.rooms_of(package))

    assert graph["pkg.low.c"] == {"pkg.low.b"}
    assert graph["pkg.high.a"] == {"pkg.low.b", "pkg.low.c"}
    assert arrows == {(FRONT_DOOR, "high"): 1, ("high", "low"): 2}
