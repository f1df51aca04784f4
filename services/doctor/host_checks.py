"""This host: the shared-memory folder the jobs put payloads in, and the GPUs NVML sees.

Shared memory is judged by doing what the client does: create a payload file as this user and
reserve its memory (``posix_fallocate``), then remove it. A folder where that fails costs speed,
not rows: each batch then travels inline in its gRPC message. GPUs come from the node's own
detection (``services/node/devices.detect_gpus``, NVML through ``gpu_metrics.nvml_status``); a
host without NVML or without a driver is described, not failed: executors that send their rows to
the node need no GPU.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from udfserve.discovery import NodeDiscovery
from udfserve.node_files import describe_uid
from udfserve.services.doctor.config import DoctorConfig
from udfserve.services.doctor.report import Finding, Status
from udfserve.services.model_server.observability.gpu_metrics import nvml_status
from udfserve.services.node.devices import GpuInfo, detect_gpus
from udfserve.shared_memory import FILE_PREFIX, FILE_SUFFIX

PROBE_FILE_BYTES = 64 << 10
"""What the probe reserves: the client's smallest payload file (``MIN_ROOM_BYTES``)."""
MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs"})
SHARED_MEMORY_FIX = (
    "see docs/deployment.md, Shared memory: /dev/shm (a tmpfs of mode 1777) for executors of the node's "
    "user; a folder of the servers' group with mode 3770 for executors of another user"
)
CUDA_ENV = "CUDA_VISIBLE_DEVICES"


def check_shared_memory(config: DoctorConfig) -> list[Finding]:
    folder = config.shared_memory_dir
    me = describe_uid(os.geteuid())
    inline = "jobs here send every batch inline in its gRPC message (slower; nothing is lost)"
    if folder is None:
        return [_shm("info", f"off (--shared-memory-dir off): {inline}", "")]
    try:
        found = folder.stat()
    except OSError as exc:
        return [_shm("warn", f"{folder} cannot be used ({exc.strerror}): {inline}", SHARED_MEMORY_FIX)]
    if not stat.S_ISDIR(found.st_mode):
        return [_shm("warn", f"{folder} is not a folder: {inline}", SHARED_MEMORY_FIX)]
    mode = stat.S_IMODE(found.st_mode)
    usage = os.statvfs(folder)
    free = usage.f_bavail * usage.f_frsize
    kind = file_system_type(folder)
    facts: dict[str, Any] = {
        "path": str(folder),
        "mode": f"{mode:04o}",
        "owner": describe_uid(found.st_uid),
        "file_system": kind,
        "free_bytes": free,
        "size_bytes": usage.f_blocks * usage.f_frsize,
    }
    findings = []
    problem = _create_payload_file(folder)
    if problem:
        findings.append(
            _shm(
                "warn",
                f"{me} cannot create payload files in {folder} (mode {mode:04o}, owner "
                f"{describe_uid(found.st_uid)}): {problem}; {inline}",
                SHARED_MEMORY_FIX,
                facts,
            )
        )
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not found.st_mode & stat.S_ISVTX:
        findings.append(
            _shm(
                "warn",
                f"{folder} has mode {mode:04o}: others may write it and it has no sticky bit, so another "
                "user can remove or rename the jobs' payload files while they are used",
                f"chmod +t {folder}",
                facts,
            )
        )
    if kind not in MEMORY_FILE_SYSTEMS:
        findings.append(
            _shm(
                "warn",
                f"{folder} is on {kind or 'an unknown file system'}, not a tmpfs: payload files are written "
                "to disk, which is slower than sending batches inline",
                "mount a tmpfs there, or point the jobs at one (spark.udfserve.sharedMemoryDir); "
                + SHARED_MEMORY_FIX,
                facts,
            )
        )
    if free < config.shared_memory_min_free_bytes:
        findings.append(
            _shm(
                "warn",
                f"{folder} has {_size(free)} free of {_size(usage.f_blocks * usage.f_frsize)}, less than "
                f"{_size(config.shared_memory_min_free_bytes)}: payload files that cannot be reserved travel "
                "inline",
                "free space there (files of stopped programs), or make the tmpfs larger "
                f"(mount -o remount,size=... {folder})",
                facts,
            )
        )
    if not findings:
        findings.append(
            _shm(
                "ok",
                f"{folder}: {kind}, mode {mode:04o}, owner {describe_uid(found.st_uid)}, {_size(free)} free; "
                f"{me} can create payload files in it",
                "",
                facts,
            )
        )
    return findings


def _shm(status: Status, summary: str, fix: str, facts: dict[str, Any] | None = None) -> Finding:
    return Finding(
        group="shared_memory", name="folder", status=status, summary=summary, fix=fix, facts=facts or {}
    )


def _create_payload_file(folder: Path) -> str:
    """Create, reserve and remove a payload file as the client does; "" when it works."""
    path = folder / f"{FILE_PREFIX}doctor-{secrets.token_hex(8)}{FILE_SUFFIX}"
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"creating a file: {exc.strerror}"
    try:
        os.posix_fallocate(descriptor, 0, PROBE_FILE_BYTES)
    except OSError as exc:
        return f"reserving {_size(PROBE_FILE_BYTES)}: {exc.strerror}"
    finally:
        os.close(descriptor)
        with contextlib.suppress(OSError):
            path.unlink()
    return ""


def file_system_type(folder: Path) -> str:
    """The type of the file system ``folder`` lies on, from ``/proc/self/mounts``; "" when unknown."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return ""
    real = os.path.realpath(folder)
    best, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):,.1f} {unit}"
    return f"{count} bytes"


def check_gpus(environ: Mapping[str, str], discovery: NodeDiscovery | None) -> list[Finding]:
    detection = detect_gpus()
    status = nvml_status()
    gpu_servers = [s for s in (discovery.servers if discovery else []) if s.device.startswith("gpu:")]
    facts: dict[str, Any] = {
        "nvml": status.available,
        "reason": status.reason,
        "driver_version": status.driver_version,
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in detection.gpus],
    }
    if detection.gpus:
        summary = f"driver {status.driver_version}; {detection.describe()}"
    elif gpu_servers:
        summary = (
            f"{detection.describe()}; the node serves {', '.join(s.device for s in gpu_servers)}, which this "
            "environment need not see (an executor sends its rows to the node)"
        )
    else:
        summary = f"{detection.describe()}: a node here serves on the CPU (or simulated devices)"
    findings = [Finding(group="gpus", name="NVML", status="info", summary=summary, facts=facts)]
    uuids = {g.uuid for g in detection.gpus}
    unseen = [s for s in gpu_servers if detection.gpus and s.device_uuid and s.device_uuid not in uuids]
    if unseen:
        findings.append(
            Finding(
                group="gpus",
                name="servers' devices",
                status="warn",
                summary=f"the discovery file's {', '.join(f'{s.device} ({s.device_uuid})' for s in unseen)} "
                "are not among the GPUs NVML lists here: the file may be another node's",
                fix="point this check and the executors at this node's runtime folder",
            )
        )
    findings.append(_cuda_visible(environ, detection.gpus))
    return findings


def _cuda_visible(environ: Mapping[str, str], gpus: tuple[GpuInfo, ...]) -> Finding:
    value = environ.get(CUDA_ENV)
    if value is None:
        summary = (
            "unset: processes started here see every GPU; the node pins each server to its own, and the "
            "client's CPU fallback hides CUDA itself"
        )
    elif value.strip() in {"", "-1"}:
        summary = (
            f"{value!r}: hides every GPU from processes started here, as executors that send their rows to "
            "the node usually do; a node started here would still find its GPUs through NVML"
        )
    else:
        summary = (
            f"{value!r}: processes started here see only these GPUs; the node finds its GPUs through NVML "
            f"and pins each server itself ({len(gpus)} NVML device(s) here)"
        )
    return Finding(group="gpus", name=CUDA_ENV, status="info", summary=summary, facts={"value": value})
