"""Command-line flags generated from a pydantic-settings class, so flags, variables and docs agree.

Precedence: a flag given on the command line, then the ``<PREFIX><FIELD>`` environment
variable, then the ``--config`` YAML file where the command has one (``settings_file``), then the
default. Flags that are not given are not passed at all, so the environment still applies to
them; a file's setting is passed only when no variable sets it. Errors name the flag and the
variable, or the file and its key for a value the file gave.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource

from udfserve.services.settings_file import SettingsFileError, read_settings_file
from udfserve.services.settings_groups import GROUPS, group_of

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


def add_settings_arguments(
    parser: argparse.ArgumentParser,
    settings_cls: type[BaseSettings],
    *,
    grouped: bool = False,
    config_file: bool = False,
) -> None:
    """A flag for each setting; ``grouped``: listed in ``--help`` under its group
    (``settings_groups``); ``config_file``: ``--config FILE`` first, read by ``settings_from_args``."""
    if config_file:
        option = parser.add_argument(
            "--config",
            dest="settings_file",
            type=Path,
            metavar="FILE",
            help="YAML file of settings, keyed by the settings' names in snake_case (max_message_bytes: "
            "1048576); a flag, then a UDFSERVE_ variable, wins over the file, the file over the default",
        )
        option.complete = _PATH_COMPLETION  # type: ignore[attr-defined]
        parser.set_defaults(settings_command=parser.prog)
    groups: dict[str, argparse._ArgumentGroup] = {}
    if grouped:
        used = {group_of(name) for name in settings_cls.model_fields}
        groups = {
            title: parser.add_argument_group(title, description)
            for title, description in GROUPS.items()
            if title in used
        }
    for name, field in settings_cls.model_fields.items():
        text = help_text(settings_cls, name)
        target = groups[group_of(name)] if grouped else parser
        if field.annotation is bool:
            action = target.add_argument(
                flag_name(name), dest=name, action=argparse.BooleanOptionalAction, help=text
            )
        else:
            action = target.add_argument(flag_name(name), dest=name, metavar=name.upper(), help=text)
        if _is_path(settings_cls, name):
            action.complete = _PATH_COMPLETION  # type: ignore[attr-defined]
    parser.set_defaults(**dict.fromkeys(settings_cls.model_fields))


_PATH_COMPLETION = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}
"""What shell completion offers for a path flag (the form of shtab.FILE, read by ``udfserve
completion``; set here so that this module needs no shtab)."""


def _is_path(settings_cls: type[BaseSettings], name: str) -> bool:
    annotation = settings_cls.model_fields[name].annotation
    return annotation is Path or Path in typing.get_args(annotation)


def _is_secret(settings_cls: type[BaseSettings], name: str) -> bool:
    """A field whose value must never be echoed (a ``SecretStr``, alone or optional)."""
    annotation = settings_cls.model_fields[name].annotation
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def settings_from_args(settings_cls: type[SettingsT], args: argparse.Namespace) -> SettingsT:
    given: dict[str, Any] = {
        name: value for name in settings_cls.model_fields if (value := getattr(args, name, None)) is not None
    }
    path: Path | None = getattr(args, "settings_file", None)
    from_file: set[str] = set()
    if path is not None:
        try:
            file_values = read_settings_file(
                path, settings_cls, getattr(args, "settings_command", "udfserve")
            )
        except SettingsFileError as exc:
            raise SettingsError(str(exc)) from None
        from_environment = EnvSettingsSource(settings_cls)()  # pydantic-settings' own reading of it
        from_file = {name for name in file_values if name not in given and name not in from_environment}
        given = {**{name: file_values[name] for name in from_file}, **given}
    try:
        return settings_cls(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            if not field:  # a check across fields: its input is every setting, secrets included
                problems.append(f"settings: {error['msg']}")
                continue
            if field in from_file:
                where = f"--config {path}, key {field}"
            else:
                where = f"{flag_name(field)} / {env_name(settings_cls, field)}"
            received = "(hidden)" if _is_secret(settings_cls, field) else repr(error.get("input"))
            problems.append(f"{where}: {error['msg']} (received {received})")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None
