"""The model repository: ``<repo>/<model>/config.yaml`` and integer ``<repo>/<model>/<version>/``.

Scanning never imports a framework and never raises for one bad model: every folder that
cannot be served becomes a ``failures`` entry naming the file at fault, so the server can start
with the models that are fine and report the rest. Loading goes through the backend named by
the model's config. One model's folder is read by ``model_folder`` (its config, its versions,
the versions its policy serves), whose files are checked by ``model_files`` to resolve inside
the repository: whoever can write the repository chooses what the server runs, and nothing else.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from udfserve.runtime.backends import LoadedModel, get_backend
from udfserve.runtime.errors import BackendNotInstalled, ModelLoadError, raise_if_stopping
from udfserve.runtime.model_files import Unservable, files_fingerprint
from udfserve.runtime.model_folder import (
    CONFIG_FILE_NAME,
    ModelVersions,
    detected_backend,
    is_version,
    parse_model_config,
    read_model,
    read_model_folder,
    resolve_model_dir,
)
from udfserve.runtime.model_formats import MODEL_FILES_TEXT, backends_present, detect_backend
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.preprocessing import with_preprocessing
from udfserve.runtime.warmup_file import with_version_warmup

__all__ = [
    "EXPECTED_LAYOUT",
    "ModelVersions",
    "RepositoryScan",
    "load_model",
    "model_source",
    "no_servable_model",
    "parse_model_config",
    "read_model",
    "resolve_model_dir",
    "scan_repository",
]
"""What the server, the CPU fallback and the tools import from here; ``read_model``,
``parse_model_config``, ``resolve_model_dir`` and ``ModelVersions`` are ``model_folder``'s."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepositoryScan:
    """What a scan found: models to load, and why the others cannot be served."""

    models: tuple[ModelVersions, ...]
    failures: Mapping[str, str]

    @property
    def sources(self) -> tuple[ModelSource, ...]:
        """The version of each model that answers a request naming no version."""
        return tuple(model.default for model in self.models)


def scan_repository(
    root: Path, only: Sequence[str] = (), *, trust_savedmodels: bool = True
) -> RepositoryScan:
    """List every servable model under ``root`` (or only the ones named), without loading any.

    ``trust_savedmodels=False`` makes a model whose version folder holds a SavedModel a failure:
    its graph could run file operations with the server's permissions (``model_folder.SAVEDMODEL_REFUSED``).
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
            models.append(read_model_folder(root, name, trust_savedmodels))
        except Unservable as exc:
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
            backend=model.config.backend or detected_backend(version_dir),
            fingerprint=files_fingerprint(root, version_dir),
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
        f"version folder {entry.name}" for entry in entries if entry.is_dir() and is_version(entry.name)
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
    source = with_version_warmup(source)  # the version folder's warmup.json, if it carries one
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
