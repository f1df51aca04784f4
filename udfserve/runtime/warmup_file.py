"""A version folder's own warm-up samples: ``<model>/<version>/warmup.json``.

Triton's ``model_warmup`` may read a sample from an ``input_data_file`` beside the model; here a
version folder may carry ``warmup.json``, holding what config.yaml's section holds::

    {"samples": [{"text": [["1.5"], ["-2"]]}]}

so a version whose inputs take other values (other ids, another vocabulary) brings the samples
that fit it.

JSON rather than YAML, an Arrow IPC or an ``.npz`` file: it is config.yaml's section written the
same way (rows as nested lists, strings as text), any pipeline that exports a model can write it,
and its parser has no aliases or compression, so the bytes bound below bounds what parsing it
costs (YAML's aliases and ``.npz``'s zip can each make a small file expand).

Precedence: ``warmup: false`` in config.yaml turns the warm-up off, and the file is not read;
otherwise the file's samples replace config.yaml's for that version (the versions without one
keep config.yaml's). The file is a model file: it must resolve inside the repository (a symlink
within it is followed), it counts in the version's fingerprint (a watching server loads the
version again when it changes), and a file that cannot be used (too large, not JSON, not the
samples' shape, a sample the model refuses) fails that version's load, naming the file from the
repository down, the bound and what was expected; the other versions and models keep serving.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.model_files import Unservable, refuse_outside
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.warmup_config import MAX_SAMPLE_ROWS, MAX_SAMPLES, WarmupConfig

WARMUP_FILE_NAME = "warmup.json"
MAX_WARMUP_FILE_BYTES = 8 << 20
"""The largest warm-up file read: parsed JSON takes several times its bytes in memory."""
EXPECTED = (
    f'a JSON object {{"samples": [...]}}: 1 to {MAX_SAMPLES} samples, each a mapping of every input '
    f"of the model to its rows (at most {MAX_SAMPLE_ROWS} a sample), as config.yaml's "
    "`warmup: {samples: [...]}`"
)


def with_version_warmup(source: ModelSource) -> ModelSource:
    """``source`` with its version folder's warm-up samples in place of config.yaml's, when the
    folder carries ``warmup.json`` and the warm-up is on; ``ModelLoadError`` naming the file
    for one that cannot be used."""
    path = source.path / WARMUP_FILE_NAME
    warmup = source.config.warmup
    if not warmup.enabled or not os.path.lexists(path):
        return source
    shown = f"{source.name}/{source.version}/{WARMUP_FILE_NAME}"
    repository = source.path.parent.parent  # the scan builds it as <repository>/<model>/<version>
    samples = read_samples(path, repository, shown)
    config = source.config.model_copy(update={"warmup": warmup.with_samples_from(samples, shown)})
    return dataclasses.replace(source, config=config)


def read_samples(path: Path, repository: Path, shown: str) -> tuple[dict[str, list[Any]], ...]:
    """The samples of the warm-up file ``path`` (named ``shown`` in messages), read within the
    bounds; ``ModelLoadError`` saying what was wrong and what was expected."""
    data = _parsed(_bounded_bytes(path, repository, shown), shown)
    if not isinstance(data, dict) or set(data) != {"samples"}:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ModelLoadError(f"{shown}: got {got}; expected {EXPECTED}")
    if not isinstance(data["samples"], list) or not data["samples"]:
        raise ModelLoadError(f"{shown}: samples is {_kind(data['samples'])}; expected {EXPECTED}")
    try:
        config = WarmupConfig.model_validate({"samples": data["samples"]})
    except ValidationError as exc:  # the inputs are left out: they may be megabytes
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ModelLoadError(f"{shown}: {problems}; expected {EXPECTED}") from None
    return config.samples


def _bounded_bytes(path: Path, repository: Path, shown: str) -> bytes:
    """The file's bytes, at most ``MAX_WARMUP_FILE_BYTES``: resolved inside the repository, a
    regular file (a FIFO would block the load), never read past the bound."""
    try:
        refuse_outside(repository, path)
        real = path.resolve()
        descriptor = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except Unservable as exc:
        raise ModelLoadError(f"{shown}: {exc}") from None
    except OSError as exc:
        raise ModelLoadError(f"{shown}: cannot open it: {exc.strerror}; expected a readable file") from None
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise ModelLoadError(f"{shown}: not a regular file; expected {EXPECTED}")
        data = b"" if status.st_size > MAX_WARMUP_FILE_BYTES else file.read(MAX_WARMUP_FILE_BYTES + 1)
    if status.st_size > MAX_WARMUP_FILE_BYTES or len(data) > MAX_WARMUP_FILE_BYTES:
        size = max(status.st_size, len(data))
        raise ModelLoadError(
            f"{shown}: {size} bytes; expected at most {MAX_WARMUP_FILE_BYTES} bytes (a few samples of a "
            "batch's rows, not a data set)"
        )
    return data


def _parsed(data: bytes, shown: str) -> object:
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelLoadError(
            f"{shown}: not UTF-8 ({exc.reason} at byte {exc.start}); expected {EXPECTED}"
        ) from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(
            f"{shown}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); expected {EXPECTED}"
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of too many digits; nesting too deep
        raise ModelLoadError(f"{shown}: {type(exc).__name__}: {exc}; expected {EXPECTED}") from None


def _kind(value: object) -> str:
    return "an empty list" if value == [] else f"a {type(value).__name__}"
