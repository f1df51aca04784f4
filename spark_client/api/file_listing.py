"""Which files ``predict_files`` reads: the data files under the paths given, each once.

Folders are searched recursively, skipping hidden names as Spark does. Inside a folder, a link
to a folder is not followed: following it could read the same files again (a link to a folder
above it is a loop, which pyarrow's recursive listing, like Spark's ``recursiveFileLookup``,
followed 40 levels deep, until the system refused the path) or add files from outside the path
without anyone asking. Spark's reader by default reads neither (it reads a folder's own files and
its partition folders'). Each link left out is logged as a warning naming its target; a path
given by the caller is followed, so a linked folder is read when it is named.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import pyarrow.fs as pafs

logger = logging.getLogger(__name__)


def filesystem_of(path: str) -> tuple[pafs.FileSystem, str]:
    """The file system holding ``path`` and the path within it: URIs by their scheme, anything
    else as a local path (made absolute, since the tasks do not share the driver's directory)."""
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(path)


def _hidden(name: str) -> bool:
    """Spark's rule for the files of a folder: names starting with ``_`` or ``.`` are not data
    (``_SUCCESS``, ``.part-0.parquet.crc``)."""
    return name.startswith(("_", "."))


def list_files(paths: str | Sequence[str]) -> list[str]:
    """Every data file under ``paths`` (files, or folders searched recursively), each once, sorted
    within each folder; hidden files and folders skipped as Spark skips them, and links to
    folders inside a folder not followed (``_local_files``)."""
    found: list[str] = []
    for given in [paths] if isinstance(paths, str) else list(paths):
        if "://" in given:
            given = given.rstrip("/")  # a URI's path comes back without its trailing slash
        filesystem, path = filesystem_of(given)
        prefix = given[: len(given) - len(path)] if "://" in given and given.endswith(path) else ""
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{given!r} does not exist; expected a parquet file or a folder of them")
        if info.type == pafs.FileType.File:
            found.append(prefix + path)
        elif isinstance(filesystem, pafs.LocalFileSystem):
            found += [prefix + file for file in _local_files(path)]
        else:
            found += [prefix + file for file in _remote_files(filesystem, path)]
    unique = list(dict.fromkeys(found))
    if not unique:
        raise FileNotFoundError(
            f"no data files under {paths!r}; expected parquet files "
            "(names starting with '_' or '.' are skipped, and links to folders are not followed)"
        )
    return unique


def _remote_files(filesystem: pafs.FileSystem, path: str) -> list[str]:
    """The data files under a folder of a remote file system (HDFS, object stores), by pyarrow's
    recursive listing: these have no links to follow (HDFS's are off unless enabled)."""
    selector = pafs.FileSelector(path, recursive=True)
    entries = sorted(filesystem.get_file_info(selector), key=lambda entry: entry.path)
    return [
        entry.path
        for entry in entries
        if entry.type == pafs.FileType.File
        and not any(_hidden(part) for part in os.path.relpath(entry.path, path).split(os.sep))
    ]


def _local_files(root: str) -> list[str]:
    """The data files under a local folder, sorted by path. A link to a folder is left out with a
    warning (links to files are read: each names one file, which cannot loop)."""
    files: list[str] = []
    folders = [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if _hidden(entry.name):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                elif entry.is_symlink() and entry.is_dir():
                    _warn_linked_folder(entry.path, root)
                elif entry.is_file():
                    files.append(entry.path)
    return sorted(files)


def _warn_linked_folder(link: str, root: str) -> None:
    """Says which link was left out, where it leads, and how to read its files after all."""
    target = os.path.realpath(link)
    real_root = os.path.realpath(root)
    if os.path.commonpath([target, os.path.realpath(os.path.dirname(link))]) == target:
        where = "a folder above it: a loop, which would read the same files again and again"
    elif os.path.commonpath([target, real_root]) == real_root:
        where = f"which is under {root!r} itself"
    else:
        where = f"outside {root!r}; to read its files too, add {target!r} to the paths"
    logger.warning("predict_files: %r is a link to the folder %r, %s: not followed", link, target, where)
