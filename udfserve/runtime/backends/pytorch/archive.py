"""What a PyTorch model file holds, checked before torch reads it: only what cannot run code passes.

``torch.export.load`` is not safe on a file from elsewhere (torch 2.13, read in its source): it
unpickles the sample inputs with ``weights_only=False`` when the safe load fails, unpickles
tensors marked ``use_pickle`` and "opaque" constants with plain pickle, loads torchbind objects
and AOTInductor's compiled libraries, evaluates every shape expression with ``sympy.sympify``
(Python's ``eval``), turns any ``torch.<attribute path>`` named as a node's target into a call
(``torch.os.system`` included), imports the module a pytree spec names, and compiles the
program's ``guards_code`` (Python source) into its guard function. So a ``.pt2`` is read here
first, as the zip and JSON it is, and refused unless:

- it is one program (``models/model.json``) whose weights and constants are raw tensor bytes
  (no pickle), with no AOTInductor, ExecuTorch or torchbind payloads;
- its guards (Python source torch compiles into the program's input check) only compare input
  sizes and numbers;
- every node of every graph calls an ATen or prims operator (but ``from_file`` and ``save``,
  which read and write files), a listed higher-order operator
  (control flow, whose subgraphs are checked too), or one of the symbolic-shape arithmetic
  functions export itself emits;
- every shape expression uses only symbol names, numbers, arithmetic and the sympy functions
  export writes (no attribute access, no other names);
- every pytree spec names plain containers (tuple, list, dict, OrderedDict); ``forward``'s
  parameter names and dict keys are Python identifiers, and parameter, buffer and constant
  names dotted identifiers (torch writes them into the Python source it generates for the
  module);
- its sample inputs load with ``torch.load(weights_only=True)``, so torch's own attempt succeeds
  and never falls back to a full unpickle;
- it was exported by the same torch major version as the one installed (the version recorded
  in the program).

The bytes checked are the bytes loaded: the caller reads the file once and hands both this module
and torch the same buffer. Before anything in it is unpacked, every entry's declared size is
bounded (``zip_entries``): torch unpacks nearly every entry, so a zip bomb anywhere in the file
is refused from the archive's directory.

A ``model.pt`` must be TorchScript (``torch.jit.save``): an archive holding TorchScript source
(``code/``) and its constants. TorchScript's own loader compiles that code and unpickles its data
with a restricted unpickler that builds TorchScript types only, never Python objects; but the
compiled code runs at load (a module's ``__setstate__``), so code naming ATen's file operators is
refused before loading. A file written by ``torch.save`` (a Python pickle, which may carry code)
is refused without unpickling it.
"""

from __future__ import annotations

import io
import json
import keyword
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from udfserve.runtime.backends.pytorch.zip_entries import (
    ArchiveRefused,
    check_unpacked_sizes,
    open_archive,
    read_entry,
    read_json,
)

PT2_FORMAT = "pt2"
EXPORT_SAVE_HINT = (
    "expected a program saved by torch.export.save(torch.export.export(model, ...), 'model.pt2')"
)
SCRIPT_SAVE_HINT = (
    "expected TorchScript (torch.jit.save(torch.jit.script(model), 'model.pt')) or a torch.export "
    "program saved as model.pt2"
)

ALLOWED_OPERATOR = re.compile(r"^torch\.ops\.(aten|prims)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+$")
FILE_OPERATORS = frozenset({"from_file", "save"})
"""ATen's operators that read or write a file named by a string (``aten::from_file``,
``aten::save``): the only ones with access beyond the tensors given, refused in both formats."""
_FILE_OPERATOR_WORD = re.compile(r"\b(" + "|".join(sorted(FILE_OPERATORS)) + r")\b")
ALLOWED_HIGHER_ORDER = frozenset(
    f"torch.ops.higher_order.{name}"
    for name in ("cond", "while_loop", "map_impl", "scan", "wrap_with_set_grad_enabled", "wrap_with_autocast")
)
"""Control flow and autocast/grad wrappers: they run the program's own subgraphs, which are checked."""

_SYMPY_WORDS = (
    "FloorDiv ModularIndexing Where PythonMod Mod CleanDiv CeilToInt FloorToInt CeilDiv LShift RShift "
    "PowByNatural FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator TruncToFloat "
    "TruncToInt RoundToInt RoundDecimal ToFloat Identity Symbol Integer Float Rational Max Min Abs Eq "
    "Ne Lt Le Gt Ge And Or Not oo int_oo True False positive integer nonnegative negative real finite "
    "zoo nan floor ceiling sqrt Pow Mul Add"
)
SYMPY_NAMES = frozenset(_SYMPY_WORDS.split())
"""What torch's deserializer offers sympify, and the sympy names its expressions are printed with."""
SYMBOL_NAME = re.compile(r"^[a-z]{1,4}\d+$")
_EXPRESSION_TOKEN = re.compile(
    r"\s+|'[a-z]{1,4}\d+'|\d+(?:\.\d+)?(?:e[+-]?\d+)?|[A-Za-z_][A-Za-z0-9_]*|\*\*|[-+*/%(),=<>!&|~^]"
)
_GUARD = re.compile(
    r"(?:\s+|L\['[A-Za-z_][A-Za-z0-9_]*'\](?:\.(?:size|stride)\(\))?|\[\d+\]|\d+(?:\.\d+)?|==|!=|<=|>=|//|\*\*"
    r"|[-+*/%(),<>]|\b(?:and|or|not|max|min|abs)\b)+"
)
"""What export writes as guards: ``L['image'].size()[0] == L['offset'].size()[0]``,
``max(1, 8*(L['x'].size()[1] // 2)) == ...``: sizes, numbers, arithmetic, comparisons, and the
builtins ``max``, ``min`` and ``abs``."""
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DOTTED_NAME = re.compile(r"(?:[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)?")
CODE_NAME_KEYS = frozenset(
    {"parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name", "fqn"}
)
"""Fields naming a module attribute or submodule: torch writes them into the generated module's
source (``getattr(self, "<name>")``), as it writes ``forward``'s parameter names and dict keys."""
PLAIN_CONTAINERS = frozenset(
    {None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict"}
)
REFUSED_PREFIXES = {
    "data/aotinductor/": "AOTInductor-compiled native code",
    "data/executorch/": "an ExecuTorch program",
    "data/mtia": "MTIA payloads",
    "xl_model_weights/": "externally stored weights",
}
MAX_FORMAT_RECORD_BYTES = 64
"""The archive_format record holds a word ("pt2")."""
SAMPLE_INPUTS = "data/sample_inputs/model.pt"


@dataclass(frozen=True)
class ExportArchive:
    """A ``.pt2`` that passed the checks: its bytes (to load) and the torch version that exported it."""

    data: bytes
    torch_version: str


def check_exported_program(
    path: Path, installed_torch: str, max_unpacked_bytes: int | None = None
) -> ExportArchive:
    """Read ``path`` once and check it (module docstring); ``ArchiveRefused`` naming what is wrong.
    ``max_unpacked_bytes``: the setting bounding what it unpacks to (``zip_entries.unpacked_bound``)."""
    data = path.read_bytes()
    archive = open_archive(data, "a torch.export archive", EXPORT_SAVE_HINT, max_unpacked_bytes)
    with archive:
        root, names = _root_and_names(archive)
        if f"{root}/archive_format" not in names:
            raise ArchiveRefused(
                f"is not a torch.export archive (no archive_format record); {EXPORT_SAVE_HINT}"
            )
        found_format = (
            read_entry(archive, f"{root}/archive_format", MAX_FORMAT_RECORD_BYTES)
            .decode("utf-8", "replace")
            .strip()
        )
        if found_format != PT2_FORMAT:
            raise ArchiveRefused(
                f"records archive format {found_format!r}, not {PT2_FORMAT!r}; {EXPORT_SAVE_HINT}"
            )
        relative = {name[len(root) + 1 :] for name in names}
        for prefix, what in REFUSED_PREFIXES.items():
            if any(name.startswith(prefix) for name in relative):
                raise ArchiveRefused(f"carries {what} ({prefix}), which is never loaded; {EXPORT_SAVE_HINT}")
        programs = sorted(name for name in relative if name.startswith("models/") and name.endswith(".json"))
        if programs != ["models/model.json"]:
            raise ArchiveRefused(f"holds programs {programs}; expected exactly one, models/model.json")
        for legacy in ("data/weights/model.pt", "data/constants/model.pt"):
            if legacy in relative:
                raise ArchiveRefused(
                    f"holds {legacy}, a pickle of the legacy format, which is never unpickled"
                )
        program = read_json(archive, f"{root}/models/model.json")
        torch_version = _check_version(program, installed_torch)
        _check_payloads(archive, root, relative)
        _check_program(program)
        _check_sample_inputs(archive, root, relative, max_unpacked_bytes)
    return ExportArchive(data=data, torch_version=torch_version)


def check_torchscript(path: Path, max_unpacked_bytes: int | None = None) -> bytes:
    """Read ``path`` once; refuse it unless it is a TorchScript archive whose code names no file
    operator, without unpickling anything, and whose entries unpack within the bound
    (``zip_entries``). Returns the bytes checked, for ``torch.jit.load``."""
    data = path.read_bytes()
    if data[:1] == b"\x80":
        raise ArchiveRefused(
            "is a Python pickle (torch.save of the legacy format), which may carry code and is never "
            f"unpickled; {SCRIPT_SAVE_HINT}"
        )
    archive = open_archive(data, "a TorchScript archive", SCRIPT_SAVE_HINT, max_unpacked_bytes)
    with archive:
        root, names = _root_and_names(archive)
        relative = {name[len(root) + 1 :] for name in names}
        if "archive_format" in relative:
            raise ArchiveRefused("is a torch.export archive: name it model.pt2, not model.pt")
        code = sorted(name for name in relative if name.startswith("code/") and name.endswith(".py"))
        if not code or "constants.pkl" not in relative:
            kind = "a pickle written by torch.save" if "data.pkl" in relative else "not TorchScript"
            raise ArchiveRefused(
                f"is {kind} (no compiled TorchScript code in it), which may carry Python code and is never "
                f"unpickled; {SCRIPT_SAVE_HINT}"
            )
        for name in code:
            text = read_entry(archive, f"{root}/{name}").decode("utf-8", "replace")
            named = sorted(set(_FILE_OPERATOR_WORD.findall(text)))
            if named:
                raise ArchiveRefused(
                    f"holds TorchScript code ({name}) naming {named}, ATen's file operators; TorchScript "
                    "runs code when it loads (__setstate__) and when it is called, so it is refused unloaded"
                )
    return data


def _root_and_names(archive: zipfile.ZipFile) -> tuple[str, set[str]]:
    names = {info.filename for info in archive.infolist() if not info.is_dir()}
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or any("/" not in name for name in names):
        raise ArchiveRefused(f"is a zip archive of another layout (top-level entries {sorted(roots)[:5]})")
    return roots.pop(), names


def major_version(version: str) -> str:
    """``"2.13.0+cpu"`` -> ``"2"``."""
    return version.split(".", 1)[0].strip()


def _check_version(program: Any, installed_torch: str) -> str:
    recorded = program.get("torch_version") if isinstance(program, dict) else None
    if not isinstance(recorded, str) or not recorded:
        raise ArchiveRefused(f"records no torch version; {EXPORT_SAVE_HINT} with torch {installed_torch}")
    if major_version(recorded) != major_version(installed_torch):
        raise ArchiveRefused(
            f"was exported with torch {recorded}, but torch {installed_torch} is installed here: a program "
            f"of another major version is not loaded; export it again with torch "
            f"{major_version(installed_torch)}.x"
        )
    return recorded


def _check_payloads(archive: zipfile.ZipFile, root: str, relative: set[str]) -> None:
    for kind in ("weights", "constants"):
        config_name = f"data/{kind}/model_{kind}_config.json"
        if config_name not in relative:
            raise ArchiveRefused(f"has no {config_name}; {EXPORT_SAVE_HINT}")
        config = read_json(archive, f"{root}/{config_name}").get("config", {})
        for fqn, payload in config.items():
            if payload.get("use_pickle"):
                raise ArchiveRefused(f"stores {kind[:-1]} {fqn!r} as a pickle, which is never unpickled")
            path_name = str(payload.get("path_name", ""))
            if kind == "constants" and not path_name.startswith("tensor_"):
                raise ArchiveRefused(
                    f"holds constant {fqn!r} ({path_name}), an object that is not a tensor (a torchbind or "
                    "opaque Python object), which is never loaded"
                )


def _check_program(program: dict[str, Any]) -> None:
    for guard in program.get("guards_code") or []:
        _check_guard(str(guard))
    for key in program.get("range_constraints", {}):
        _check_expression(key)
    graph_module = program.get("graph_module", {})
    for call in graph_module.get("module_call_graph", []) or []:
        signature = call.get("signature") or {}
        for spec_key in ("in_spec", "out_spec"):
            if signature.get(spec_key):
                _check_tree_spec(signature[spec_key])
        for name in signature.get("forward_arg_names") or []:
            _check_name(name, "forward parameter", IDENTIFIER)
    for node in _walk(program):
        if "__enum__" in node:
            raise ArchiveRefused(f"names a Python enum ({node.get('fqn')!r}), which is never imported")
        for key in CODE_NAME_KEYS.intersection(node):
            _check_name(node[key], key.replace("_", " "), DOTTED_NAME)
        if "target" in node and "inputs" in node and "outputs" in node:
            _check_target(str(node["target"]))
        if isinstance(node.get("expr_str"), str):
            _check_expression(node["expr_str"])
        if node.get("custom_obj_values"):
            raise ArchiveRefused("holds torchbind objects (custom_obj_values), which are never loaded")


def _check_name(name: Any, what: str, pattern: re.Pattern[str]) -> None:
    if not isinstance(name, str) or not pattern.fullmatch(name) or keyword.iskeyword(name):
        raise ArchiveRefused(
            f"holds the {what} {str(name)[:120]!r}, which is not a plain name; names become Python source "
            "when torch builds the module, so it is refused"
        )


def _walk(value: Any) -> Iterator[dict[str, Any]]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def allowed_target_names() -> frozenset[str]:
    """The non-operator call targets export emits for symbolic shapes (``_operator.add`` ...)."""
    from torch._export.serde.serialize import _SYM_OPS

    return frozenset(f"{op.__module__}.{op.__name__}" for op in _SYM_OPS) | {"_operator.getitem"}


def _check_target(target: str) -> None:
    if ALLOWED_OPERATOR.match(target) and target.split(".")[3] in FILE_OPERATORS:
        raise ArchiveRefused(f"calls {target!r}, which reads or writes files; it is never run")
    if ALLOWED_OPERATOR.match(target) or target in ALLOWED_HIGHER_ORDER or target in allowed_target_names():
        return
    raise ArchiveRefused(
        f"calls {target[:200]!r}, which is not an ATen or prims operator: only those (and export's "
        "control flow and shape arithmetic) run here"
    )


def _check_expression(expression: str) -> None:
    """Only symbols, numbers, arithmetic and the listed sympy names: the text goes to ``eval``."""
    position = 0
    while position < len(expression):
        token = _EXPRESSION_TOKEN.match(expression, position)
        if token is None:
            break
        text = token.group()
        if (text[0].isalpha() or text[0] == "_") and text not in SYMPY_NAMES and not SYMBOL_NAME.match(text):
            break
        position = token.end()
    else:
        return
    shown = expression if len(expression) <= 120 else f"{expression[:120]}..."
    raise ArchiveRefused(
        f"holds the shape expression {shown!r}, which is not plain shape arithmetic (at character "
        f"{position}); it would be evaluated as Python and is refused"
    )


def _check_guard(guard: str) -> None:
    """Only arithmetic on input sizes and numbers: the text is compiled into the guard function."""
    if _GUARD.fullmatch(guard):
        return
    shown = guard if len(guard) <= 120 else f"{guard[:120]}..."
    raise ArchiveRefused(
        f"carries the guard {shown!r}, which is not a comparison of input sizes; guards are compiled "
        "as Python, so it is refused"
    )


def _check_tree_spec(text: str) -> None:
    try:
        _protocol, spec = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise ArchiveRefused(f"holds a pytree spec that cannot be read: {exc}") from exc
    for node in _walk(spec):
        if "type" in node and node["type"] not in PLAIN_CONTAINERS:
            raise ArchiveRefused(
                f"takes or returns a {node['type']!r}: only tensors in tuples, lists and dicts are served"
            )
        if node.get("type") in ("builtins.dict", "collections.OrderedDict") and node.get("context"):
            for key in json.loads(node["context"]):
                if isinstance(key, str):
                    _check_name(key, "dict key", IDENTIFIER)


def _check_sample_inputs(
    archive: zipfile.ZipFile, root: str, relative: set[str], max_unpacked_bytes: int | None
) -> None:
    """The sample inputs are a ``torch.save`` zip of their own, which ``torch.load`` (here, and in
    ``torch.export.load``) unpacks: bounded as the file is, before either reads it."""
    import torch

    if SAMPLE_INPUTS not in relative or archive.getinfo(f"{root}/{SAMPLE_INPUTS}").file_size == 0:
        return
    data = read_entry(archive, f"{root}/{SAMPLE_INPUTS}")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as inputs:
            check_unpacked_sizes(inputs, len(data), max_unpacked_bytes)
    except ArchiveRefused as exc:
        raise ArchiveRefused(
            f"holds sample inputs ({SAMPLE_INPUTS}), a zip archive of their own, which {exc}"
        ) from exc
    except zipfile.BadZipFile as exc:
        raise ArchiveRefused(
            f"holds sample inputs ({SAMPLE_INPUTS}) that are not a zip archive, as torch.save writes: {exc}"
        ) from exc
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        raise ArchiveRefused(
            f"holds sample inputs ({SAMPLE_INPUTS}) that are not plain tensors "
            f"(torch.load(weights_only=True) refused them: {type(exc).__name__}); torch would unpickle "
            "them in full, so the file is refused"
        ) from exc
