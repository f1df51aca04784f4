"""The files of a model in the repository: each must resolve inside the repository, and what they
are now (names, sizes, modification times) is summed up in one fingerprint.

Whoever can write the repository chooses what the server runs, and nothing else: every file the
server reads for a model (its config.yaml, every file of the version it serves) must resolve
inside the repository, so a symlink cannot make the server load (and answer with) a file it can
read elsewhere. The fingerprint changes while a copy into a version folder is under way and when
a file of it is replaced, which is how a watching server knows to wait, or to load it again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


class Unservable(ValueError):
    """One model folder cannot be served; the message names the file and the problem (a
    ``ValueError`` to callers of ``parse_model_config``)."""


def refuse_outside(root: Path, path: Path) -> None:
    """Refuse ``path`` when it resolves outside ``root`` (a symlink leaving the repository)."""
    try:
        resolved = path.resolve()
        inside = resolved.is_relative_to(root.resolve())
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise Unservable(
            f"cannot resolve {path}: {exc}; expected a file or folder that resolves inside the repository"
        ) from exc
    if not inside:
        raise Unservable(
            f"{path} resolves to {resolved}, outside the repository {root}; expected every file of a "
            "model inside the repository (symlinks within it are followed)"
        )


def files_fingerprint(root: Path, version_dir: Path) -> str:
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
            refuse_outside(root, entry)
            if entry.is_dir():
                folders.append(entry)
                continue
            try:
                status = entry.stat()
            except OSError as exc:
                raise Unservable(f"cannot read {entry}: {exc}") from exc
            relative = entry.relative_to(version_dir)
            digest.update(f"{relative}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()
