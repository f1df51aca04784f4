"""A PyTorch model file opened as the zip it is, bounded before anything in it is decompressed.

A zip entry says in the archive's central directory what it unpacks to, and deflate reaches about
1,000 to 1: a 1.9 MB ``model.pt2`` whose weight entry is 1.9 GB of deflated zeros is a valid
archive. torch (2.13, measured entry by entry) unpacks nearly every entry when it loads a file,
not only those read here: ``torch.export.load`` every weight and constant, the version records and
the sample inputs (a zip of their own, which ``torch.load`` unpacks in turn), ``torch.jit.load``
every entry but ``byteorder``; a weight entry of 1 GiB even loads, its tensor taking the first
bytes. So every entry is judged from the directory, before a byte is unpacked:

- stored or deflated, the two methods torch's reader (miniz) knows; ``zipfile`` also reads bzip2
  and LZMA, and unpacks them without a cap on the output of one step, at ratios near a million;
- an entry of ``RATIO_CHECKED_FROM_BYTES`` or more claims at most ``MAX_ENTRY_RATIO`` to 1: torch
  stores weights as they are and deflates TorchScript code a few to 1;
- all entries together unpack to at most the bound (``unpacked_bound``): the
  ``UDFSERVE_TORCH_MAX_UNPACKED_BYTES`` setting, else twice the file's size plus 64 MiB, and never
  beyond ``UNPACKED_CEILING_BYTES``. An archive as torch writes it unpacks to less than its size.

torch's reader allocates what the directory declares and stops there (an entry inflating further
fails), so a directory that passes bounds what torch unpacks. What is read here (JSON records,
code, sample inputs) goes through ``read_entry``: never more than the entry declares, and
``zipfile`` inflating at most that much in one step, where ``ZipFile.read`` inflates up to 2 GiB in
one step before cutting to the declared size (a directory that understates an entry).
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

UNPACKED_PER_FILE_BYTE = 2
UNPACKED_ALLOWANCE_BYTES = 64 << 20
UNPACKED_CEILING_BYTES = 1 << 40
"""The hard maximum: no setting and no file size lets an archive unpack to more than 1 TiB."""
MAX_ENTRY_RATIO = 100
RATIO_CHECKED_FROM_BYTES = 1 << 20
"""Smaller entries are not judged by their ratio (a 4 KiB record of one repeated byte is no bomb):
the total bound holds them."""
READABLE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_OTHER_METHODS = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA"}
MAX_PROGRAM_JSON_BYTES = 256 << 20
"""The largest program description read: the graph, not the weights (those are raw tensor files)."""
SETTING = "UDFSERVE_TORCH_MAX_UNPACKED_BYTES"


class ArchiveRefused(Exception):
    """The file is not one the PyTorch backend loads; the message says what it holds and what is expected."""


def unpacked_bound(packed_bytes: int, max_unpacked_bytes: int | None) -> int:
    """What an archive of ``packed_bytes`` may unpack to: the setting, else twice its size plus
    64 MiB; at most ``UNPACKED_CEILING_BYTES`` either way."""
    if max_unpacked_bytes is not None:
        return min(max_unpacked_bytes, UNPACKED_CEILING_BYTES)
    return min(packed_bytes * UNPACKED_PER_FILE_BYTE + UNPACKED_ALLOWANCE_BYTES, UNPACKED_CEILING_BYTES)


def open_archive(data: bytes, what: str, hint: str, max_unpacked_bytes: int | None) -> zipfile.ZipFile:
    """``data`` as a zip archive whose directory passed ``check_unpacked_sizes``; nothing unpacked."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ArchiveRefused(f"is not {what} (truncated, or not a zip archive: {exc}); {hint}") from exc
    try:
        check_unpacked_sizes(archive, len(data), max_unpacked_bytes)
    except ArchiveRefused:
        archive.close()
        raise
    return archive


def check_unpacked_sizes(archive: zipfile.ZipFile, packed_bytes: int, max_unpacked_bytes: int | None) -> None:
    """Refuse, from the directory alone, an archive that unpacks beyond what torch writes (module
    docstring); ``packed_bytes`` is the archive's size."""
    entries = archive.infolist()
    for info in entries:
        if info.compress_type not in READABLE_METHODS:
            method = _OTHER_METHODS.get(info.compress_type, f"method {info.compress_type}")
            raise ArchiveRefused(
                f"holds {info.filename} compressed with {method}; torch reads entries stored or deflated "
                "only, and writes them so"
            )
        if (
            info.file_size >= RATIO_CHECKED_FROM_BYTES
            and info.file_size > MAX_ENTRY_RATIO * info.compress_size
        ):
            ratio = info.file_size / max(info.compress_size, 1)
            raise ArchiveRefused(
                f"holds {info.filename}, which its directory says unpacks to {info.file_size:,} bytes "
                f"from {info.compress_size:,} ({ratio:,.0f} to 1); torch stores entries as they are or "
                f"deflates them a few to 1, and an entry of {RATIO_CHECKED_FROM_BYTES >> 20} MiB or more "
                f"claiming over {MAX_ENTRY_RATIO} to 1 is refused unread (a zip bomb)"
            )
    total = sum(info.file_size for info in entries)
    bound = unpacked_bound(packed_bytes, max_unpacked_bytes)
    if total > bound:
        largest = max(entries, key=lambda info: info.file_size)
        how = (
            f"{SETTING}"
            if max_unpacked_bytes is not None
            else f"twice its size plus {UNPACKED_ALLOWANCE_BYTES >> 20} MiB; {SETTING} sets another bound"
        )
        raise ArchiveRefused(
            f"unpacks to {total:,} bytes ({len(entries)} entries, the largest {largest.filename} of "
            f"{largest.file_size:,}), more than the {bound:,} allowed for a file of {packed_bytes:,} bytes "
            f"({how}); refused unread"
        )


def read_entry(archive: zipfile.ZipFile, name: str, most_bytes: int | None = None) -> bytes:
    """Entry ``name``, no larger than ``most_bytes`` (default: what its directory record declares,
    which ``check_unpacked_sizes`` bounded). Inflated in steps of at most that size (module docstring)."""
    declared = archive.getinfo(name).file_size
    if most_bytes is not None and declared > most_bytes:
        raise ArchiveRefused(f"holds {name} of {declared:,} bytes; expected at most {most_bytes:,}")
    try:
        with archive.open(name) as entry:
            return entry.read(declared)
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise ArchiveRefused(
            f"holds {name}, which does not unpack to the {declared:,} bytes its directory record "
            f"declares: {exc}"
        ) from exc


def read_json(archive: zipfile.ZipFile, name: str) -> Any:
    """Entry ``name`` as JSON, of at most ``MAX_PROGRAM_JSON_BYTES``."""
    data = read_entry(archive, name, MAX_PROGRAM_JSON_BYTES)
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ArchiveRefused(f"{name} cannot be read as JSON: {exc}") from exc
