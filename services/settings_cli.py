"""Command-line flags generated from a pydantic-settings class, so flags, variables and docs agree.

Precedence: a flag given on the command line, then the ``<PREFIX><FIELD>`` environment
variable, then the default. Flags that are not given are not passed at all, so the
environment still applies to them. Errors name the flag and the variable.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any, TypeVar

from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


class SettingsError(ValueError):
    """An invalid flag or environment value; the message names both spellings."""


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(settings_cls: type[BaseSettings], field: str) -> str:
    return (str(settings_cls.model_config.get("env_prefix", "")) + field).upper()


def default_text(value: Any) -> str:
    """A default as a user types it on the command line: ``/dev/shm``, ``185,1000``, ``none``."""
    if value is None or value == "" or value == ():
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ",".join(str(item) for item in value)
    return str(value)


def help_text(settings_cls: type[BaseSettings], name: str) -> str:
    """A flag's help: the field's description, its variable, and its default unless the
    description already says what an empty default means."""
    field = settings_cls.model_fields[name]
    if not field.description:
        raise TypeError(f"setting {settings_cls.__name__}.{name} has no description; expected one for --help")
    parts = [f"env {env_name(settings_cls, name)}"]
    if field.is_required():
        parts.append("required")
    elif field.default_factory is not None:
        parts.append(f"default: {default_text(field.get_default(call_default_factory=True))}")
    else:
        value = field.get_default()
        if default_text(value) != "none" or "default" not in field.description:
            parts.append(f"default: {default_text(value)}")
    return f"{field.description} [{'; '.join(parts)}]"


def add_settings_arguments(parser: argparse.ArgumentParser, settings_cls: type[BaseSettings]) -> None:
    for name, field in settings_cls.model_fields.items():
        text = help_text(settings_cls, name)
        if field.annotation is bool:
            parser.add_argument(flag_name(name), dest=name, action=argparse.BooleanOptionalAction, help=text)
        else:
            parser.add_argument(flag_name(name), dest=name, metavar=name.upper(), help=text)
    parser.set_defaults(**dict.fromkeys(settings_cls.model_fields))


def _is_secret(settings_cls: type[BaseSettings], name: str) -> bool:
    """A field whose value must never be echoed (a ``SecretStr``, alone or optional)."""
    annotation = settings_cls.model_fields[name].annotation
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def settings_from_args(settings_cls: type[SettingsT], args: argparse.Namespace) -> SettingsT:
    given: dict[str, Any] = {
        name: value for name in settings_cls.model_fields if (value := getattr(args, name, None)) is not None
    }
    try:
        return settings_cls(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            if not field:  # a check across fields: its input is every setting, secrets included
                problems.append(f"settings: {error['msg']}")
                continue
            where = f"{flag_name(field)} / {env_name(settings_cls, field)}"
            received = "(hidden)" if _is_secret(settings_cls, field) else repr(error.get("input"))
            problems.append(f"{where}: {error['msg']} (received {received})")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None
