"""The model repository: ``<repo>/<model>/config.yaml`` and integer ``<repo>/<model>/<version>/``.

Scanning never imports a framework and never raises for one bad model: every folder that
cannot be served becomes a ``failures`` entry naming the file at fault, so the server can start
with the models that are fine and report the rest. Loading goes through the backend named by
the model's config.

Whoever can write the repository chooses what the server runs, and nothing else: every file the
server reads for a model (its config.yaml, every file of the version it serves) must resolve
inside the repository, so a symlink cannot make the server load (and answer with) a file it can
read elsewhere. A TensorFlow SavedModel is a graph that may itself read and write files when it
runs; ``trust_savedmodels=False`` refuses SavedModels for repositories not every writer of which
is trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from udfserve.runtime.backends import LoadedModel, get_backend
from udfserve.runtime.errors import BackendNotInstalled, ModelLoadError, raise_if_stopping
from udfserve.runtime.model_config import ModelConfig, validate_model_name
from udfserve.runtime.model_formats import (
    MODEL_FILES_TEXT,
    SAVED_MODEL_FILE,
    backends_present,
    detect_backend,
)
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.preprocessing import with_preprocessing

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


@dataclass(frozen=True)
class RepositoryScan:
    """What a scan found: models to load, and why the others cannot be served."""

    models: tuple[ModelVersions, ...]
    failures: Mapping[str, str]

    @property
    def sources(self) -> tuple[ModelSource, ...]:
        """The version of each model that answers a request naming no version."""
        return tuple(model.default for model in self.models)


class _Unservable(ValueError):
    """One model folder cannot be served; the message names the file and the problem (a
    ``ValueError`` to callers of ``parse_model_config``)."""


def resolve_model_dir(root: Path, name: str) -> Path:
    """``root / name`` after checking the name is safe and the folder stays inside ``root``."""
    validate_model_name(name)
    model_dir = root / name
    if not model_dir.resolve().is_relative_to(root.resolve()):
        raise ValueError(
            f"model folder {model_dir} resolves to {model_dir.resolve()}, outside the repository {root}"
        )
    return model_dir


def scan_repository(
    root: Path, only: Sequence[str] = (), *, trust_savedmodels: bool = True
) -> RepositoryScan:
    """List every servable model under ``root`` (or only the ones named), without loading any.

    ``trust_savedmodels=False`` makes a model whose version folder holds a SavedModel a failure:
    its graph could run file operations with the server's permissions (``SAVEDMODEL_REFUSED``).
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"model repository {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"model repository {root} is not a folder")

    present = _model_folder_names(root)
    failures: dict[str, str] = {}
    if only:
        wanted = list(dict.fromkeys(only))
        for name in wanted:
            if name not in present:
                failures[name] = f"model {name!r} is not in the repository {root}; found: {present}"
        names = [name for name in wanted if name in present]
    else:
        names = present

    models = []
    for name in names:
        try:
            models.append(_read_model(root, name, trust_savedmodels))
        except _Unservable as exc:
            logger.warning("model %s cannot be served: %s", name, exc)
            failures[name] = str(exc)
        except OSError as exc:
            logger.warning("model %s cannot be served: %s", name, exc)
            failures[name] = f"cannot read {root / name}: {exc}"
    return RepositoryScan(models=tuple(models), failures=failures)


def model_source(
    root: Path, name: str, version: int = 0, *, trust_savedmodels: bool = True, any_present: bool = False
) -> ModelSource:
    """The source of ``version`` of model ``name`` (0: the one a request naming no version gets),
    read as a server reads it; ``ModelLoadError`` when the model cannot be served or its policy
    does not serve that version (the CPU fallback computes what a server would, or nothing).
    ``any_present``: a version whose folder is there, served by the policy or not (a version a job
    pinned, which servers keep leased after a newer one replaced it)."""
    scan = scan_repository(root, [name], trust_savedmodels=trust_savedmodels)
    if name in scan.failures:
        raise ModelLoadError(scan.failures[name])
    (model,) = scan.models
    if not version:
        return model.default
    for source in model.sources:
        if source.version == version:
            return source
    if any_present and version in model.available:
        version_dir = root / name / str(version)
        return dataclasses.replace(
            model.default,
            version=version,
            path=version_dir,
            backend=model.config.backend or _detected_backend(version_dir),
            fingerprint=_files_fingerprint(root, version_dir),
        )
    raise ModelLoadError(
        f"model {name!r} version {version} is not served: its version policy serves "
        f"{[source.version for source in model.sources]} of the versions {list(model.available)} "
        f"in {root / name}"
    )


def no_servable_model(root: Path, scan: RepositoryScan, only: Sequence[str] = ()) -> str:
    """Why a scan of ``root`` (for the models ``only`` names, if any) found nothing to serve: what
    the folder holds, the layout expected, and, when ``root`` looks like a model's own folder (or
    a version folder), the repository it probably belongs to."""
    entries = [entry for entry in sorted(Path(root).iterdir()) if not entry.name.startswith(".")]
    found = [f"{name!r} ({reason})" for name, reason in scan.failures.items()]
    files = [entry.name for entry in entries if not entry.is_dir()]
    if files:
        found.append(f"file(s) {', '.join(files)} (a model is a folder)")
    holds = "; ".join(found) or "nothing, it is empty"
    named = f" of those --models names ({', '.join(only)})" if only else ""
    message = (
        f"model repository {root} holds no servable model{named}: found {holds}; expected {EXPECTED_LAYOUT}"
    )
    guess = _repository_guess(Path(root), entries)
    return f"{message}; {guess}" if guess else message


EXPECTED_LAYOUT = (
    "a folder per model, <repo>/<model>/config.yaml (optional) and <repo>/<model>/<version>/ (an integer, "
    f"holding {MODEL_FILES_TEXT})"
)


def _repository_guess(root: Path, entries: Sequence[Path]) -> str:
    """Where the repository probably is, when ``root`` looks like a model's folder or a version folder."""
    artifacts = sorted(name for names in backends_present(root).values() for name in names)
    if artifacts:
        repository = root.absolute().parent.parent
        return (
            f"{root} looks like a version folder of a model (it holds {', '.join(artifacts)}): "
            f"the repository is probably {repository} (--model-repository {repository})"
        )
    marks = [entry.name for entry in entries if entry.name == CONFIG_FILE_NAME and entry.is_file()]
    marks += [
        f"version folder {entry.name}" for entry in entries if entry.is_dir() and _is_version(entry.name)
    ]
    if marks:
        repository = root.absolute().parent
        return (
            f"{root} looks like a model's own folder (it holds {', '.join(marks)}): "
            f"its parent {repository} is probably the repository (--model-repository {repository})"
        )
    return ""


def load_model(source: ModelSource) -> LoadedModel:
    """Load one model with the backend its config names or its files call for, behind its
    config's pre-processing step if it has one (``preprocessing``); raises ``ModelLoadError``
    (``BackendNotInstalled`` when that backend's framework is not installed), also for a panic of
    a framework's native code (``PanicException``, not an ``Exception``), so that a caller's
    ``except ModelLoadError`` sees every failure of the model's own."""
    try:
        backend = get_backend(source.backend or detect_backend(source.path))
    except BackendNotInstalled as exc:
        raise BackendNotInstalled(f"model {source.name!r} version {source.version}: {exc}") from exc
    except ValueError as exc:
        raise ModelLoadError(f"model {source.name!r} ({source.path}): {exc}") from exc
    started_s = time.perf_counter()
    try:
        model = with_preprocessing(backend.load(source), source)
    except ModelLoadError:
        raise
    except BaseException as exc:
        raise_if_stopping(exc)
        raise ModelLoadError(
            f"model {source.name!r} version {source.version} ({source.path}): {type(exc).__name__}: {exc}"
        ) from exc
    logger.info(
        "loaded model %s version %d with %s in %.2f s",
        source.name,
        source.version,
        backend.platform,
        time.perf_counter() - started_s,
    )
    return model


def _model_folder_names(root: Path) -> list[str]:
    """Sub-folders of ``root``, hidden ones (``.git``, editor caches) left out."""
    names = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            logger.debug("ignoring hidden entry %s in the model repository", entry)
        elif entry.is_dir():
            names.append(entry.name)
        else:
            logger.debug("ignoring file %s in the model repository: models are folders", entry)
    return names


def read_model(
    root: Path, name: str, config: ModelConfig, *, trust_savedmodels: bool = True
) -> ModelVersions:
    """Model ``name`` of the repository ``root`` with ``config`` in place of its config.yaml (a
    load call that gives one), checked as a scan checks it; ``ValueError`` naming what is wrong."""
    return _read_model(Path(root), name, trust_savedmodels, config)


def _read_model(
    root: Path, name: str, trust_savedmodels: bool, given: ModelConfig | None = None
) -> ModelVersions:
    try:
        model_dir = resolve_model_dir(root, name)
    except ValueError as exc:
        raise _Unservable(f"{root / name}: {exc}") from exc
    config_path = model_dir / CONFIG_FILE_NAME
    if given is None:
        _refuse_outside(root, config_path)
        config, config_fingerprint = _read_config(config_path)
    else:
        config = given
        config_fingerprint = (
            "given:" + hashlib.blake2b(config.model_dump_json().encode(), digest_size=16).hexdigest()
        )
        config_path = Path(f"the config given for model {name!r}")
    if config.name is not None and config.name != name:
        raise _Unservable(f"{config_path}: name {config.name!r} does not match the folder name {name!r}")
    versions = _versions(root, model_dir)
    if not versions:
        raise _Unservable(
            f"no version folder in {model_dir}: expected integer-named folders such as {model_dir / '1'}"
        )
    served = config.versions.served(versions)
    if not served:
        raise _Unservable(
            f"{config_path}: its version policy ({_policy_text(config)}) serves none of the versions "
            f"{list(versions)} in {model_dir}"
        )
    sources = []
    for version in served:
        version_dir = model_dir / str(version)
        fingerprint = _files_fingerprint(root, version_dir)
        if not trust_savedmodels and (version_dir / SAVED_MODEL_FILE).exists():
            raise _Unservable(f"{version_dir / SAVED_MODEL_FILE}: {SAVEDMODEL_REFUSED}")
        sources.append(
            ModelSource(
                name=name,
                version=version,
                path=version_dir,
                config=config,
                available_versions=versions,
                backend=config.backend or _detected_backend(version_dir),
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


def _detected_backend(version_dir: Path) -> str:
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


def _refuse_outside(root: Path, path: Path) -> None:
    """Refuse ``path`` when it resolves outside ``root`` (a symlink leaving the repository)."""
    try:
        resolved = path.resolve()
        inside = resolved.is_relative_to(root.resolve())
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise _Unservable(
            f"cannot resolve {path}: {exc}; expected a file or folder that resolves inside the repository"
        ) from exc
    if not inside:
        raise _Unservable(
            f"{path} resolves to {resolved}, outside the repository {root}; expected every file of a "
            "model inside the repository (symlinks within it are followed)"
        )


def _files_fingerprint(root: Path, version_dir: Path) -> str:
    """Refuse a version folder any entry of which (a model file, a SavedModel's ``variables/``
    or ``assets/`` and what they hold) resolves outside ``root``; return a digest of the name,
    size and modification time of every file in it, which changes while a copy into the folder
    is under way and when a file of it is replaced. Symlinked folders inside the repository are
    walked too, so what the backend reads is exactly what was checked here."""
    folders = [version_dir]
    seen: set[Path] = set()
    digest = hashlib.blake2b(digest_size=16)
    while folders:
        folder = folders.pop()
        real = folder.resolve()
        if real in seen:  # a symlink back to a folder walked already
            continue
        seen.add(real)
        for entry in sorted(folder.iterdir()):
            _refuse_outside(root, entry)
            if entry.is_dir():
                folders.append(entry)
                continue
            try:
                status = entry.stat()
            except OSError as exc:
                raise _Unservable(f"cannot read {entry}: {exc}") from exc
            relative = entry.relative_to(version_dir)
            digest.update(f"{relative}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _read_config(path: Path) -> tuple[ModelConfig, str]:
    """The config and a digest of its text. A missing or empty config.yaml means every default."""
    if not path.exists():
        return ModelConfig(), ""
    try:
        raw = path.read_bytes()
        digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
        data = yaml.safe_load(raw.decode("utf-8"))
    except yaml.YAMLError as exc:
        raise _Unservable(f"{path} is not valid YAML: {_yaml_problem(exc)}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _Unservable(f"cannot read {path}: {exc}") from exc
    return parse_model_config(data, str(path)), digest


def parse_model_config(data: object, where: str) -> ModelConfig:
    """``data`` (a config.yaml's, or a config given with a load call) as a ``ModelConfig``; the
    error names ``where`` and every field at fault."""
    if data is None:
        return ModelConfig()
    if not isinstance(data, dict):
        raise _Unservable(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '<root>'}: {error['msg']} "
            f"(got {error['input']!r})"
            for error in exc.errors()
        )
        raise _Unservable(f"{where}: invalid model config: {problems}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: where the parser stopped and why (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(filter(None, [getattr(exc, "context", None), getattr(exc, "problem", None)]))
    if mark is None or not problem:
        return " ".join(str(exc).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _is_version(name: str) -> bool:
    return name.isdigit() and str(int(name)) == name and int(name) > 0


def _versions(root: Path, model_dir: Path) -> tuple[int, ...]:
    """Integer-named sub-folders, ascending. Other names (``1.bak``, ``latest``) are ignored."""
    versions = []
    for entry in model_dir.iterdir():
        if not entry.is_dir():
            continue
        if not _is_version(entry.name):
            logger.debug("ignoring %s: version folders are positive integers", entry)
            continue
        if not entry.resolve().is_relative_to(root.resolve()):
            raise _Unservable(
                f"version folder {entry} resolves to {entry.resolve()}, outside the repository {root}"
            )
        versions.append(int(entry.name))
    return tuple(sorted(versions))
