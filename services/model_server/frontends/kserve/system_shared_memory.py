"""Triton's system shared-memory regions, as the KServe front ends register, read and write them.

A Triton client creates a POSIX shared-memory object (``shm_open`` of a key such as
``/input_data``, which Linux keeps as ``/dev/shm/input_data``), registers it under a region name
with an offset and a size, and then names the region in an input's or a requested output's
parameters instead of sending the tensor. Registrations are the server's, not a connection's,
as in Triton: any client may use or unregister a region another registered.

The rules of the Arrow protocol's shared memory (``arrow/shared_memory.py``) hold here too:

- the key names a file directly in the allowed folder (``--shared-memory-dir``, ``/dev/shm`` by
  default): a leading ``/``, then at most ``MAX_KEY_CHARS`` letters, digits, ``_``, ``-`` or
  ``.``, never ``.`` or ``..``; the file is opened by the server (``O_NOFOLLOW``: a symbolic
  link is refused), must be a regular file of the server's user or of ``--shared-memory-uids``,
  and must hold ``offset + byte_size`` bytes when registered;
- the server never maps it: a client can truncate its file at any time, and a load from a
  mapping past the file's end is SIGBUS, the end of the server. Inputs are read with ``preadv``
  into the server's memory, outputs written with ``pwrite``; a file that shrank gives a short
  read or fails the size check before a write, INVALID_ARGUMENT for that request only, naming
  the region, the offset and the size;
- registrations are bounded, server-wide and per client (the peer's address, without its port):
  a number of regions and a total of registered bytes, RESOURCE_EXHAUSTED naming the bound. A
  region costs the server a descriptor and no memory; the bytes of one request read from regions
  are bounded by ``--shared-memory-max-request-bytes``, as Arrow requests are.

All calls run on the serving loop; a lock still guards the table, so that a descriptor is never
closed while another thread reads through it.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import grpc

from udfserve.log_text import clip
from udfserve.runtime.errors import InvalidInput, ServingError

MAX_KEY_CHARS = 200
MAX_NAME_CHARS = 128
KEY_PATTERN = re.compile(rf"/[A-Za-z0-9_.-]{{1,{MAX_KEY_CHARS}}}")
"""A key as ``shm_open`` takes it, naming a file directly in the allowed folder."""


class RegionNotFound(ServingError):
    """A status or use of a region nobody registered."""

    code = grpc.StatusCode.NOT_FOUND


class RegionExists(ServingError):
    code = grpc.StatusCode.ALREADY_EXISTS


class RegionsExhausted(ServingError):
    """A registration beyond a bound on regions or on their bytes."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class RegionRefused(ServingError):
    """A file the server cannot use as a region (missing, a link, another user's, too small)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True)
class RegionBounds:
    """How many regions, and how many registered bytes, the server and each client may hold."""

    max_regions: int = 256
    max_bytes: int = 64 << 30
    max_regions_per_client: int = 64
    max_bytes_per_client: int = 16 << 30
    max_request_bytes: int = 256 << 20
    """Bytes one request may read from regions: each is copied into the server's memory."""


@dataclass(frozen=True)
class Region:
    """One registration: the server's descriptor of the file, and who registered it."""

    name: str
    key: str
    offset: int
    byte_size: int
    descriptor: int
    client: str


class SystemSharedMemory:
    """The server's registered regions."""

    def __init__(
        self, folder: Path, bounds: RegionBounds = RegionBounds(), other_uids: frozenset[int] = frozenset()
    ) -> None:
        self.folder = folder
        self.bounds = bounds
        self._other_uids = other_uids
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    # -- registration ------------------------------------------------------------------------
    def register(self, name: str, key: str, offset: int, byte_size: int, client: str) -> None:
        """Open ``key`` and keep it as region ``name`` (see the module's rules)."""
        what = f"system shared-memory region {clip(name, 100)!r}"
        if not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable():
            raise InvalidInput(
                f"region name {clip(name, 100)!r} ({len(name)} characters); expected 1 to "
                f"{MAX_NAME_CHARS} printable characters"
            )
        if not KEY_PATTERN.fullmatch(key) or key in ("/.", "/.."):
            raise RegionRefused(
                f"{what}: key {clip(key, 100)!r} is not a shared-memory key this server opens; expected "
                f"'/' then 1 to {MAX_KEY_CHARS} letters, digits, '_', '-' or '.' (not '.' or '..'), naming "
                f"a file directly in {self.folder}"
            )
        if offset < 0 or byte_size <= 0:
            raise InvalidInput(
                f"{what}: offset {offset}, byte_size {byte_size}; expected offset >= 0 and byte_size > 0"
            )
        with self._lock:
            if name in self._regions:
                raise RegionExists(
                    f"{what} is registered already (key {self._regions[name].key!r}); expected a new name, "
                    "or the region unregistered first"
                )
            self._check_bounds(what, byte_size, client)
            descriptor = self._open(what, key, offset + byte_size)
            self._regions[name] = Region(name, key, offset, byte_size, descriptor, client)

    def _check_bounds(self, what: str, byte_size: int, client: str) -> None:
        bounds = self.bounds
        mine = [region for region in self._regions.values() if region.client == client]
        held = sum(region.byte_size for region in self._regions.values())
        held_by_client = sum(region.byte_size for region in mine)
        checks = (
            (
                len(self._regions) + 1 > bounds.max_regions,
                "regions",
                "server",
                bounds.max_regions,
                "max-regions",
            ),
            (
                held + byte_size > bounds.max_bytes,
                "registered bytes",
                "server",
                bounds.max_bytes,
                "max-bytes",
            ),
            (
                len(mine) + 1 > bounds.max_regions_per_client,
                "regions",
                f"client {client}",
                bounds.max_regions_per_client,
                "max-regions-per-client",
            ),
            (
                held_by_client + byte_size > bounds.max_bytes_per_client,
                "registered bytes",
                f"client {client}",
                bounds.max_bytes_per_client,
                "max-bytes-per-client",
            ),
        )
        for exceeded, unit, holder, bound, flag in checks:
            if exceeded:
                raise RegionsExhausted(
                    f"{what} of {byte_size} bytes would exceed the {holder}'s bound of {bound} {unit} "
                    f"(--kserve-shared-memory-{flag}); expected regions unregistered first"
                )

    def _open(self, what: str, key: str, needed: int) -> int:
        path = self.folder / key[1:]
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            link = " (a symbolic link, which this server never follows)" if exc.errno == 40 else ""
            raise RegionRefused(
                f"{what}: cannot open {path} ({exc.strerror}){link}; expected a shared-memory object the "
                "client created on this node (shm_open of the key), readable and writable by this server"
            ) from None
        try:
            info = os.fstat(descriptor)
            trusted = info.st_uid == os.geteuid() or info.st_uid in self._other_uids
            if not stat.S_ISREG(info.st_mode) or not trusted:
                raise RegionRefused(
                    f"{what}: {path} is not a regular file of this server's user (uid {os.geteuid()}) or "
                    f"of --shared-memory-uids; received mode {stat.filemode(info.st_mode)}, uid {info.st_uid}"
                )
            if info.st_size < needed:
                raise RegionRefused(
                    f"{what}: {path} holds {info.st_size} bytes; expected at least offset + byte_size = "
                    f"{needed}"
                )
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor

    def unregister(self, name: str) -> None:
        """Forget region ``name`` (all regions for an empty name); an unknown name is no error, as
        in Triton."""
        with self._lock:
            names = [name] if name else list(self._regions)
            for each in names:
                region = self._regions.pop(each, None)
                if region is not None:
                    os.close(region.descriptor)

    def close(self) -> None:
        self.unregister("")

    def status(self, name: str) -> list[Region]:
        """Every region for an empty name, else the one named; ``RegionNotFound`` for an unknown."""
        with self._lock:
            if not name:
                return list(self._regions.values())
            region = self._regions.get(name)
        if region is None:
            raise RegionNotFound(f"system shared-memory region {clip(name, 100)!r} is not registered")
        return [region]

    # -- use by requests -----------------------------------------------------------------------
    def read(self, name: str, offset: int, byte_size: int, what: str) -> bytearray:
        """``byte_size`` bytes at ``offset`` of region ``name``, copied; ``InvalidInput`` when the
        region is unknown, the range is outside it, or the file no longer holds it."""
        data = bytearray(byte_size)
        view = memoryview(data)
        with self._lock:
            region = self._used(name, offset, byte_size, what)
            start = region.offset + offset
            done = 0
            try:
                while done < byte_size:
                    got = os.preadv(region.descriptor, [view[done:]], start + done)
                    if got == 0:
                        break
                    done += got
            except OSError as exc:
                raise InvalidInput(f"{what}: cannot read region {region.name!r} ({exc.strerror})") from None
            if done < byte_size:
                raise self._shrunk(region, offset, byte_size, what, f"reads {done} bytes")
        return data

    def write(self, name: str, offset: int, byte_size: int, data: memoryview, what: str) -> None:
        """Write ``data`` at ``offset`` of region ``name``, whose client gave it ``byte_size``
        bytes there; ``InvalidInput`` when it does not fit or the file shrank below the region."""
        if len(data) > byte_size:
            raise InvalidInput(
                f"{what} is {len(data)} bytes; the shared-memory range it names holds {byte_size}: expected "
                "a larger shared_memory_byte_size"
            )
        with self._lock:
            region = self._used(name, offset, byte_size, what)
            start = region.offset + offset
            size = os.fstat(region.descriptor).st_size
            if size < start + len(data):  # a pwrite past the end would grow the client's file back
                raise self._shrunk(region, offset, byte_size, what, f"holds {size} bytes")
            done = 0
            try:
                while done < len(data):
                    done += os.pwrite(region.descriptor, data[done:], start + done)
            except OSError as exc:
                raise InvalidInput(f"{what}: cannot write region {region.name!r} ({exc.strerror})") from None

    def check(self, name: str, offset: int, byte_size: int, what: str) -> None:
        """``InvalidInput`` unless region ``name`` is registered and holds the range."""
        with self._lock:
            self._used(name, offset, byte_size, what)

    def _used(self, name: str, offset: int, byte_size: int, what: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise InvalidInput(
                f"{what} names system shared-memory region {clip(name, 100)!r}, which is not registered; "
                "expected a registered region"
            )
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidInput(
                f"{what} names bytes {offset}..{offset + byte_size} of region {region.name!r}, which has "
                f"{region.byte_size}; expected a range inside the region"
            )
        return region

    @staticmethod
    def _shrunk(region: Region, offset: int, byte_size: int, what: str, found: str) -> InvalidInput:
        return InvalidInput(
            f"{what}: region {region.name!r} (key {region.key!r}) at offset {offset}, {byte_size} bytes: the "
            f"file {found} now; expected it to keep the size it had when registered (offset "
            f"{region.offset} + {region.byte_size} bytes)"
        )


def client_of(peer: str) -> str:
    """The client a gRPC peer string names, without its port (``ipv4:10.0.0.3:52011`` is
    ``ipv4:10.0.0.3``): each connection has a port of its own, a client's host is what holds.
    An IPv6 host is named ``ipv6:[::1]`` whether the peer string escapes its brackets
    (``ipv6:%5B::1%5D:52011``, as newer gRPC cores write it) or not, so that a client is the same
    one on the python port, on the native port (compiled against the system's gRPC) and over HTTP."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return unquote(peer.rsplit(":", 1)[0])
    return peer
