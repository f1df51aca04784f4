"""Rows the Spark client's CPU fallback answered on a node, reported where its supervisor counts them.

The fallback runs inside the Spark job, so the rows it answers are counted in the job's own
statistics only, where Prometheus never looks. A node's supervisor exports them instead, as
``udfserve_client_fallback_rows_total`` (``services/node/fallback_metrics.py``), from small
files the client writes into the node's **fallback reports folder**, which the discovery file
names (``fallback_reports_dir``).

Why files, not a request to the supervisor's HTTP app: a file says who wrote it (its owner, which
the writer cannot forge), where an HTTP request from a local port says nothing; and the supervisor
reads them only when it is scraped, so a client costs it nothing between scrapes and a flood of
files nothing beyond the bounds of one read.

The format, per writing process: ``<uid>-<token>.json``, the token random per process (Spark runs
one task at a time in a Python worker), so no two processes share a file and each replaces its own
atomically (a temporary file, then ``os.replace``): ``{"application": <Spark application id>,
"rows": {<model>: <rows answered by the fallback, since the process began>}}`` (one application
per process: a new one starts a new file). The counts only grow; the supervisor adds what each file
gained since its last read.

The folder, created by the supervisor: mode 0700 in a private runtime folder (only its user's
executors write there), 1733 in a shared one (anyone creates a file, nobody but its owner and the
folder's can remove or replace it, and nobody else can list it: ``/var/spool/cron``'s rule). Nothing
here reads ``os.environ``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

from udfserve.node_files import UntrustedNodeFile, check_folder

FALLBACK_REPORTS_DIR_NAME = "fallback-reports"
PRIVATE_FOLDER_MODE = 0o700
SHARED_FOLDER_MODE = 0o1733
MAX_REPORT_BYTES = 16 << 10
"""The largest report read: a process's one application and a few models take about 200 bytes."""
MAX_MODELS_PER_REPORT = 16
"""Models counted per report file; a report naming more is refused whole."""
MAX_ROWS = 1 << 53
"""Above this a count is refused: no job answers that many rows, and JSON's numbers stay exact."""
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
APPLICATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
REPORT_NAME = re.compile(r"(?P<uid>[0-9]{1,10})-(?P<token>[0-9a-f]{16})\.json")


class ReportRefused(ValueError):
    """A report file the supervisor does not count; the message says why."""


def report_path(folder: Path, uid: int, pid: int, tokens: dict[int, str]) -> Path:
    """This process's report file: ``tokens`` keeps one random token per pid (a forked worker
    gets a file of its own)."""
    token = tokens.setdefault(pid, secrets.token_hex(8))
    return folder / f"{uid}-{token}.json"


def check_reports_folder(folder: Path, trusted: frozenset[int]) -> None:
    """Refuse a folder a trusted user did not make, or that others may write without the sticky
    bit (UntrustedNodeFile; FileNotFoundError when it is missing)."""
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid not in trusted:
        raise UntrustedNodeFile(
            f"the fallback reports folder ({folder}) is not a folder of a trusted user (uid {found.st_uid})"
        )
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not found.st_mode & stat.S_ISVTX:
        raise UntrustedNodeFile(
            f"the fallback reports folder ({folder}) has mode {stat.S_IMODE(found.st_mode):04o}: others "
            "may replace its files; expected 0700 or 1733"
        )
    check_folder(folder.parent, trusted, "the runtime folder", "the node's runtime folder is not its own")


def add_fallback_rows(path: Path, application: str, model: str, rows: int) -> None:
    """Add ``rows`` of ``model`` to this process's report at ``path``: read, add, replace. A
    report of another application is started again (a process serves one application)."""
    counts: dict[str, int] = {}
    try:
        current = json.loads(path.read_bytes()[:MAX_REPORT_BYTES])
        if current.get("application") == application:
            counts = {str(k): int(v) for k, v in current.get("rows", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        counts = {}
    if model not in counts and len(counts) >= MAX_MODELS_PER_REPORT:
        return  # the supervisor would refuse the file whole
    counts[model] = min(counts.get(model, 0) + rows, MAX_ROWS)
    payload = json.dumps({"application": application, "rows": counts}, sort_keys=True).encode()
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(payload)
        os.chmod(temporary, 0o644)  # the supervisor may run as another user
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def parse_report(data: bytes) -> tuple[str, dict[str, int]]:
    """A report's application and rows by model; ReportRefused naming what is wrong."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportRefused(f"larger than {MAX_REPORT_BYTES} bytes")
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise ReportRefused(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ReportRefused("not a JSON object")
    application, rows = document.get("application"), document.get("rows")
    if not isinstance(application, str) or not APPLICATION_ID.fullmatch(application):
        raise ReportRefused(f"application {application!r} is not a Spark application id")
    if not isinstance(rows, dict) or len(rows) > MAX_MODELS_PER_REPORT:
        raise ReportRefused(f"rows must be an object of at most {MAX_MODELS_PER_REPORT} models")
    counts: dict[str, int] = {}
    for model, count in rows.items():
        if not MODEL_NAME.fullmatch(model):
            raise ReportRefused(f"model {model!r} is not a model name")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_ROWS:
            raise ReportRefused(f"rows of {model!r} must be a count from 0 to {MAX_ROWS}, received {count!r}")
        counts[model] = count
    return application, counts


def read_report(folder: Path, name: str) -> tuple[int, str, dict[str, int]]:
    """The owner, application and rows by model of the report ``name`` in ``folder``, read through
    a descriptor opened without following a link; ReportRefused when its name, type, owner or
    contents are not a report's (FileNotFoundError when it went meanwhile)."""
    matched = REPORT_NAME.fullmatch(name)
    if matched is None:
        raise ReportRefused("not named <uid>-<16 hex digits>.json")
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ReportRefused(f"cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        found = os.fstat(file.fileno())
        if not stat.S_ISREG(found.st_mode):
            raise ReportRefused("not a regular file")
        if found.st_uid != int(matched["uid"]):
            raise ReportRefused(f"named for uid {matched['uid']}, owned by uid {found.st_uid}")
        data = file.read(MAX_REPORT_BYTES + 1)
    application, counts = parse_report(data)
    return found.st_uid, application, counts
