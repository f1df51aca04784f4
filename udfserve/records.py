"""The node's small JSON records as plain frozen dataclasses, checked against their own annotations.

The discovery file, the lease files and a node start (``NodeStart``) are written by one side and
read by the other, and the reader is often a Spark task. pydantic there costs each Python worker
about 15 MiB of resident memory and a second of imports (docs/benchmarks.md, "What each import
adds in a worker"), for records of a dozen fields. So each record is one dataclass, used by its
writer and its readers alike, whose ``__post_init__`` calls ``check_fields``; ``record_from_json``
and ``record_from_dict`` read one from what a writer wrote, ``record_to_dict`` gives what to write.

The annotations understood are the ones these records use: ``str``, ``int``, ``float`` (an int is
taken), ``bool``, ``None`` in a union, ``Literal[...]``, ``list[X]``, ``tuple[X, ...]``,
``dict[str, X]`` and another such dataclass. An error names the record, the field (with its path
into lists and nested records), what was expected and what was received.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

RecordT = TypeVar("RecordT")


class RecordError(ValueError):
    """A record that does not have the fields, or the kinds of values, its dataclass declares."""


def check_fields(record: object) -> None:
    """Raise ``RecordError`` for a field of the dataclass ``record`` whose value its annotation refuses."""
    hints = _hints(type(record))
    for item in dataclasses.fields(record):  # type: ignore[arg-type]
        _check(getattr(record, item.name), hints[item.name], f"{type(record).__name__}.{item.name}")


def record_from_dict(
    cls: type[RecordT], data: object, *, extra: Literal["ignore", "forbid"] = "ignore"
) -> RecordT:
    """An instance of the dataclass ``cls`` from a JSON object: nested records and tuples made from
    their JSON forms, unknown keys ignored (a newer writer's fields) or refused."""
    return _build(cls, data, cls.__name__, extra)


def record_from_json(
    cls: type[RecordT], text: str | bytes, *, extra: Literal["ignore", "forbid"] = "ignore"
) -> RecordT:
    """``record_from_dict`` of a JSON text; ``RecordError`` names what is not JSON."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordError(
            f"{cls.__name__}: expected a JSON object, received text that is not JSON ({exc})"
        ) from None
    return record_from_dict(cls, data, extra=extra)


def record_to_dict(record: object) -> dict[str, Any]:
    """The record as JSON values: nested records as objects, tuples as lists."""
    plain: dict[str, Any] = _plain(dataclasses.asdict(record))  # type: ignore[call-overload,assignment]
    return plain


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _hints(cls: type) -> dict[str, Any]:
    hints = getattr(cls, "__record_hints__", None)
    if hints is None or hints[0] is not cls:
        hints = (cls, typing.get_type_hints(cls))
        cls.__record_hints__ = hints  # type: ignore[attr-defined]
    return hints[1]  # type: ignore[no-any-return]


def _build(cls: type[RecordT], data: object, where: str, extra: str) -> RecordT:
    if not isinstance(data, Mapping):
        raise RecordError(f"{where}: expected a JSON object, received {_received(data)}")
    hints = _hints(cls)
    names = {item.name for item in dataclasses.fields(cls) if item.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown and extra == "forbid":
        raise RecordError(f"{where}: unknown fields {unknown}; expected only {sorted(names)}")
    missing = [
        item.name
        for item in dataclasses.fields(cls)  # type: ignore[arg-type]
        if item.init
        and item.name not in data
        and item.default is dataclasses.MISSING
        and item.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise RecordError(f"{where}: missing fields {missing}")
    values = {name: _convert(data[name], hints[name], f"{where}.{name}", extra) for name in names & set(data)}
    try:
        return cls(**values)
    except RecordError as exc:
        raise RecordError(str(exc) if where == cls.__name__ else f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{where}: {exc}") from None


def _convert(value: object, hint: Any, where: str, extra: str) -> object:
    """The JSON form of ``value`` turned into what ``hint`` holds: records and tuples; the rest is
    checked once the record is built."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        chosen = [arg for arg in args if arg is not type(None)]
        return value if value is None or len(chosen) != 1 else _convert(value, chosen[0], where, extra)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _build(hint, value, where, extra)
    if origin is tuple and isinstance(value, list):
        return tuple(_convert(item, args[0], f"{where}[{index}]", extra) for index, item in enumerate(value))
    if origin is list and isinstance(value, list):
        return [_convert(item, args[0], f"{where}[{index}]", extra) for index, item in enumerate(value)]
    return value


def _check(value: object, hint: Any, where: str) -> None:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return
        chosen = [arg for arg in args if arg is not type(None)]
        if len(chosen) == 1:
            _check(value, chosen[0], where)
            return
        raise RecordError(f"{where}: unions of several kinds are not records' fields ({hint})")
    if origin is Literal:
        if value not in args:
            raise RecordError(f"{where}: expected one of {list(args)}, received {value!r}")
        return
    if origin in (list, tuple):
        if not isinstance(value, origin):
            raise RecordError(f"{where}: expected a {origin.__name__}, received {_received(value)}")
        for index, item in enumerate(value):  # type: ignore[var-annotated,arg-type]
            _check(item, args[0], f"{where}[{index}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, received {_received(value)}")
        for key, item in value.items():
            _check(key, args[0], f"{where} (a key)")
            _check(item, args[1], f"{where}[{key!r}]")
        return
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"{where}: expected a number, received {_received(value)}")
        return
    if hint is int and isinstance(value, bool):
        raise RecordError(f"{where}: expected an integer, received {_received(value)}")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise RecordError(f"{where}: expected {_kind(hint)}, received {_received(value)}")


def _kind(hint: type) -> str:
    return {str: "a string", int: "an integer", bool: "true or false"}.get(hint, f"a {hint.__name__}")


def _received(value: object) -> str:
    return f"{value!r} ({type(value).__name__})" if value is not None else "null"
