"""``--config FILE``: the settings of ``udfserve serve`` or ``udfserve node`` read from a YAML file.

The file is one mapping whose keys are the settings' names as in the environment variables without
their prefix, in lower case (``max_message_bytes: 1048576`` for ``--max-message-bytes`` and
``UDFSERVE_MAX_MESSAGE_BYTES``). It is the lowest source but the defaults: a flag, then the
environment variable, win over it, so one file can be shared by many hosts and a host change a
setting without editing it.

YAML 1.1 reads ``off``, ``no``, ``on`` and ``yes`` as booleans, which would turn ``port: off`` into
port 0 (a free port) instead of no TCP listener. The file is read with YAML 1.2's booleans
(``true`` and ``false`` only), so ``off`` stays the word the settings understand, as on the
command line.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings


class SettingsFileError(ValueError):
    """A settings file that cannot be used; the message names the file and, where one is to
    blame, the key."""


class _Loader(yaml.SafeLoader):
    """The safe loader with YAML 1.2's booleans: ``true`` and ``false``, not ``on``/``off``/``yes``/``no``."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def read_settings_file(path: Path, settings_cls: type[BaseSettings], command: str) -> dict[str, Any]:
    """The settings a YAML file gives, by field name, refused when the file cannot be read, is not
    one mapping, or names a setting that ``command`` (``udfserve serve``) does not have."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsFileError(f"cannot read --config {path}: {exc.strerror or exc}") from None
    try:
        document = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise SettingsFileError(f"--config {path} is not valid YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise SettingsFileError(
            f"--config {path} holds a YAML {type(document).__name__}; expected a mapping of setting names "
            "to values, such as 'max_message_bytes: 1048576'"
        )
    known = settings_cls.model_fields
    unknown = [key for key in document if not isinstance(key, str) or key not in known]
    if unknown:
        raise SettingsFileError(
            f"--config {path}: {'; '.join(_unknown_key(key, settings_cls, command) for key in unknown)}; "
            f"the settings of `{command}` are: {', '.join(known)}"
        )
    return dict(document)


def _unknown_key(key: object, settings_cls: type[BaseSettings], command: str) -> str:
    known = settings_cls.model_fields
    text = f"{key!r} is not a setting of `{command}`"
    spelled = str(key).lstrip("-").replace("-", "_").lower()
    if spelled in known:
        return f"{text} (did you mean {spelled!r}? keys are written as the settings' names, in snake_case)"
    key_hint = getattr(settings_cls, "file_key_hint", None)  # a class whose keys others mistake for its own
    if key_hint is not None and (hint := key_hint(spelled)):
        return f"{text}: {hint}"
    close = difflib.get_close_matches(spelled, list(known), n=1)
    return f"{text} (did you mean {close[0]!r}?)" if close else text
