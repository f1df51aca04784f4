"""One model folder of the repository: ``<model>/config.yaml`` (optional) and integer-named
``<model>/<version>/`` folders, read into the versions its policy serves.

Reading never imports a framework and raises ``Unservable`` (a ``ValueError``) naming the file at
fault for a folder that cannot be served, so a scan can report it and serve the models beside it.
A TensorFlow SavedModel is a graph that may itself read and write files when it runs;
``trust_savedmodels=False`` refuses SavedModels for repositories not every writer of which is
trusted. Every file read must resolve inside the repository (``model_files``).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from udfserve.runtime.model_config import ModelConfig, validate_model_name
from udfserve.runtime.model_files import Unservable, files_fingerprint, refuse_outside
from udfserve.runtime.model_formats import SAVED_MODEL_FILE, detect_backend
from udfserve.runtime.model_source import ModelSource

logger = logging.getLogger(__name__)

CONFIG_FILE_NAME = "config.yaml"


@dataclass(frozen=True)
class ModelVersions:
    """One model of the repository: its config, its version folders, and one source per version
    its policy serves (ascending; the last answers requests that name no version)."""

    name: str
    config: ModelConfig
    available: tuple[int, ...]
    sources: tuple[ModelSource, ...]
    config_fingerprint: str
    """Changes when config.yaml changes: every served version is then loaded again with it."""

    @property
    def default(self) -> ModelSource:
        return self.sources[-1]


def resolve_model_dir(root: Path, name: str) -> Path:
    """``root / name`` after checking the name is safe and the folder stays inside ``root``."""
    validate_model_name(name)
    model_dir = root / name
    if not model_dir.resolve().is_relative_to(root.resolve()):
        raise ValueError(
            f"model folder {model_dir} resolves to {model_dir.resolve()}, outside the repository {root}"
        )
    return model_dir


def read_model(
    root: Path, name: str, config: ModelConfig, *, trust_savedmodels: bool = True
) -> ModelVersions:
    """Model ``name`` of the repository ``root`` with ``config`` in place of its config.yaml (a
    load call that gives one), checked as a scan checks it; ``ValueError`` naming what is wrong."""
    return read_model_folder(Path(root), name, trust_savedmodels, config)


def read_model_folder(
    root: Path, name: str, trust_savedmodels: bool, given: ModelConfig | None = None
) -> ModelVersions:
    """Model ``name`` of ``root`` as a scan reads it: its config.yaml (``given`` in its place when
    a load call gives one), its version folders, and a source for each version its policy serves;
    ``Unservable`` naming the file at fault."""
    try:
        model_dir = resolve_model_dir(root, name)
    except ValueError as exc:
        raise Unservable(f"{root / name}: {exc}") from exc
    config_path = model_dir / CONFIG_FILE_NAME
    if given is None:
        refuse_outside(root, config_path)
        config, config_fingerprint = _read_config(config_path)
    else:
        config = given
        config_fingerprint = (
            "given:" + hashlib.blake2b(config.model_dump_json().encode(), digest_size=16).hexdigest()
        )
        config_path = Path(f"the config given for model {name!r}")
    if config.name is not None and config.name != name:
        raise Unservable(f"{config_path}: name {config.name!r} does not match the folder name {name!r}")
    versions = _versions(root, model_dir)
    if not versions:
        raise Unservable(
            f"no version folder in {model_dir}: expected integer-named folders such as {model_dir / '1'}"
        )
    served = config.versions.served(versions)
    if not served:
        raise Unservable(
            f"{config_path}: its version policy ({_policy_text(config)}) serves none of the versions "
            f"{list(versions)} in {model_dir}"
        )
    sources = []
    for version in served:
        version_dir = model_dir / str(version)
        fingerprint = files_fingerprint(root, version_dir)
        if not trust_savedmodels and (version_dir / SAVED_MODEL_FILE).exists():
            raise Unservable(f"{version_dir / SAVED_MODEL_FILE}: {SAVEDMODEL_REFUSED}")
        sources.append(
            ModelSource(
                name=name,
                version=version,
                path=version_dir,
                config=config,
                available_versions=versions,
                backend=config.backend or detected_backend(version_dir),
                fingerprint=fingerprint,
            )
        )
    return ModelVersions(
        name=name,
        config=config,
        available=versions,
        sources=tuple(sources),
        config_fingerprint=config_fingerprint,
    )


def detected_backend(version_dir: Path) -> str:
    """The backend the folder's files call for, or "": a version folder with no model file (or
    the files of two backends) fails when that version is loaded, as any broken version does,
    not when the repository is scanned (the versions next to it keep serving)."""
    try:
        return detect_backend(version_dir)
    except ValueError:
        return ""


def _policy_text(config: ModelConfig) -> str:
    if config.version is not None:
        return f"version: {config.version}"
    return "version_policy: " + str(config.versions.model_dump(exclude_defaults=True))


SAVEDMODEL_REFUSED = (
    "a TensorFlow SavedModel, refused because SavedModels are not trusted (--no-trust-savedmodels): "
    "its graph can read and write files with the server's permissions when it loads and runs; "
    "expected a Keras file (model.keras), or --trust-savedmodels for a repository whose every "
    "writer is trusted"
)


def _read_config(path: Path) -> tuple[ModelConfig, str]:
    """The config and a digest of its text. A missing or empty config.yaml means every default."""
    if not path.exists():
        return ModelConfig(), ""
    try:
        raw = path.read_bytes()
        digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
        data = yaml.safe_load(raw.decode("utf-8"))
    except yaml.YAMLError as exc:
        raise Unservable(f"{path} is not valid YAML: {_yaml_problem(exc)}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise Unservable(f"cannot read {path}: {exc}") from exc
    return parse_model_config(data, str(path)), digest


def parse_model_config(data: object, where: str) -> ModelConfig:
    """``data`` (a config.yaml's, or a config given with a load call) as a ``ModelConfig``; the
    error names ``where`` and every field at fault."""
    if data is None:
        return ModelConfig()
    if not isinstance(data, dict):
        raise Unservable(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '<root>'}: {error['msg']} "
            f"(got {error['input']!r})"
            for error in exc.errors()
        )
        raise Unservable(f"{where}: invalid model config: {problems}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: where the parser stopped and why (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(filter(None, [getattr(exc, "context", None), getattr(exc, "problem", None)]))
    if mark is None or not problem:
        return " ".join(str(exc).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def is_version(name: str) -> bool:
    return name.isdigit() and str(int(name)) == name and int(name) > 0


def _versions(root: Path, model_dir: Path) -> tuple[int, ...]:
    """Integer-named sub-folders, ascending. Other names (``1.bak``, ``latest``) are ignored."""
    versions = []
    for entry in model_dir.iterdir():
        if not entry.is_dir():
            continue
        if not is_version(entry.name):
            logger.debug("ignoring %s: version folders are positive integers", entry)
            continue
        if not entry.resolve().is_relative_to(root.resolve()):
            raise Unservable(
                f"version folder {entry} resolves to {entry.resolve()}, outside the repository {root}"
            )
        versions.append(int(entry.name))
    return tuple(sorted(versions))
