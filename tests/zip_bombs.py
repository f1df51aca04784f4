"""Zip archives written entry by entry, so a test can hold a model archive with one entry replaced
by gigabytes of deflated zeros (a zip bomb) without ever holding those gigabytes itself.

``zipfile`` can only deflate what it is given, gigabytes of zeros at about 200 MB/s; here the
deflate stream of one chunk of zeros is made once and repeated (each copy ends byte-aligned with a
sync flush, so the copies follow each other as blocks of one stream), and the archive's headers
are written by hand: a 2 GiB entry costs 2 MiB on disk and a second to write.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ZERO_CHUNK_BYTES = 16 << 20
_FINAL_EMPTY_BLOCK = b"\x03\x00"
"""A last deflate block holding nothing: what ``flush(Z_FINISH)`` writes after a sync flush."""


@dataclass(frozen=True)
class Payload:
    """What one member of an archive holds: ``declared_size`` is what its headers say it unpacks to."""

    method: int
    crc: int
    declared_size: int
    compressed_size: int
    chunks: Iterable[bytes]


def _deflated_zero_chunk(size: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(bytes(size)) + compressor.flush(zlib.Z_SYNC_FLUSH)


def _zeros_crc(size: int) -> int:
    crc, left, zeros = 0, size, bytes(ZERO_CHUNK_BYTES)
    while left:
        step = min(left, ZERO_CHUNK_BYTES)
        crc = zlib.crc32(zeros[:step], crc)
        left -= step
    return crc


def deflated_zeros(size: int, *, declared_size: int | None = None, crc: int | None = None) -> Payload:
    """``size`` zero bytes, deflated (about 1,000 to 1); the headers may declare another size and
    checksum (a lying central directory)."""
    whole, rest = divmod(size, ZERO_CHUNK_BYTES)
    chunk = _deflated_zero_chunk(ZERO_CHUNK_BYTES) if whole else b""
    tail = _deflated_zero_chunk(rest) if rest else b""

    def chunks() -> Iterator[bytes]:
        for _ in range(whole):
            yield chunk
        yield tail + _FINAL_EMPTY_BLOCK

    return Payload(
        method=zipfile.ZIP_DEFLATED,
        crc=_zeros_crc(size) if crc is None else crc,
        declared_size=size if declared_size is None else declared_size,
        compressed_size=whole * len(chunk) + len(tail) + len(_FINAL_EMPTY_BLOCK),
        chunks=chunks(),
    )


def deflated(chunks: Sequence[bytes]) -> Payload:
    """``chunks`` joined, deflated as zip tools do (level 6)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    packed = b"".join(compressor.compress(chunk) for chunk in chunks) + compressor.flush()
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return Payload(zipfile.ZIP_DEFLATED, crc, sum(len(chunk) for chunk in chunks), len(packed), [packed])


def stored(data: bytes) -> Payload:
    """``data`` kept as it is, as torch writes every entry of a program."""
    return Payload(zipfile.ZIP_STORED, zlib.crc32(data), len(data), len(data), [data])


def write_zip(path: Path, entries: Iterable[tuple[str, Payload]]) -> Path:
    """``path`` holding ``entries`` (name, payload) in order (no zip64: every size under 4 GiB)."""
    central = bytearray()
    count = 0
    with path.open("wb") as out:
        for entry_name, payload in entries:
            name = entry_name.encode()
            offset = out.tell()
            sizes = (payload.crc, payload.compressed_size, payload.declared_size)
            out.write(
                struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, payload.method, 0, 0x21, *sizes, len(name), 0)
            )
            out.write(name)
            for chunk in payload.chunks:
                out.write(chunk)
            central += struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                20,
                20,
                0,
                payload.method,
                0,
                0x21,
                *sizes,
                len(name),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            central += name
            count += 1
        directory_at = out.tell()
        out.write(central)
        out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), directory_at, 0))
    return path


def with_entry_replaced(archive: Path, suffix: str, payload: Payload, path: Path) -> Path:
    """A copy of ``archive`` at ``path``: the entry whose name ends in ``suffix`` holds ``payload``
    under its own name, every other entry is kept, stored."""
    with zipfile.ZipFile(archive) as source:
        names = [info.filename for info in source.infolist()]
        matching = [name for name in names if name.endswith(suffix)]
        assert len(matching) == 1, f"{archive} holds {matching} ending in {suffix!r}; expected one"
        entries = ((name, payload if name == matching[0] else stored(source.read(name))) for name in names)
        return write_zip(path, entries)
