"""``udfserve_client_fallback_rows_total``: the rows the Spark clients' CPU fallback answered on this
node, read from their reports (``udfserve.fallback_reports``) when the supervisor is scraped.

Bounded whatever the clients write, since any local user may write a report in a shared runtime
folder:

- one scrape looks at most at ``MAX_SCANNED_ENTRIES`` names and reads at most
  ``MAX_REPORT_FILES`` reports, the node user's first, each at most ``MAX_REPORT_BYTES``; a user
  other than the node's keeps at most ``MAX_REPORTS_PER_OTHER_USER`` reports (the rest are
  removed unread); a file that is not a report (its name, type, owner or contents) is
  removed, as is a report unchanged for ``REPORT_RETENTION_S`` (its counts stay in the totals)
  and a temporary file older than ``TEMPORARY_RETENTION_S``, so files put there to take up a
  scrape's reads are gone after a few scrapes;
- the label sets are bounded: at most ``MAX_FALLBACK_SERIES`` (model, application, owner)
  series, as the servers bound their per-application series (``MAX_TRACKED_APPS``); rows of a
  series beyond it are counted under ``model="other", application="other"``, so the total by
  owner stays whole;
- ``owner`` says whose process wrote the report: ``node`` for the node's own user and root,
  ``other`` for anyone else. Only the first are the node's to believe; another user's count is
  exported (their jobs use the node too) but labelled, so an alert can leave it aside.

Counts only grow: what a report gained since the last read is added (a report that shrank was
started again, and counts whole).
"""

from __future__ import annotations

import bisect
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from udfserve.fallback_reports import (
    PRIVATE_FOLDER_MODE,
    REPORT_NAME,
    SHARED_FOLDER_MODE,
    ReportRefused,
    read_report,
)

logger = logging.getLogger(__name__)

MAX_REPORT_FILES = 1024
"""Reports one scrape reads, the node user's first: a node's executors write one report per Python
worker and application, so a few hundred at most; more waits for a later scrape."""
MAX_SCANNED_ENTRIES = 16_384
"""Folder entries one scrape looks at (names only: a few milliseconds)."""
MAX_REPORTS_PER_OTHER_USER = 256
"""Reports kept of any one user other than the node's; beyond, removed unread, so that one user's
files cannot crowd out the others'."""
MAX_REMEMBERED = 65_536
"""(report, model) counts remembered between scrapes, whatever the scans saw."""
MAX_FALLBACK_SERIES = 256
"""Distinct (model, application, owner) series exported; beyond, rows count under "other"."""
REPORT_RETENTION_S = 86_400.0
"""A report unchanged this long belongs to a worker long gone: removed once counted."""
TEMPORARY_RETENTION_S = 60.0
"""A report's temporary file (a name starting with a dot) older than this is removed."""
OVERFLOW = "other"


def prepare_reports_folder(folder: Path, shared: bool) -> None:
    """Create the reports folder (or take up this node's own from an earlier run) with its mode:
    1733 when executors of other users use the node (``shared``), 0700 otherwise. A folder of
    another user is refused, as the runtime folder is (``runtime_dir.RuntimeDirRefused``)."""
    from udfserve.services.node.runtime_dir import RuntimeDirRefused

    mode = SHARED_FOLDER_MODE if shared else PRIVATE_FOLDER_MODE
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = folder.lstat()
        if found.st_uid != os.geteuid() or not stat.S_ISDIR(found.st_mode):
            raise RuntimeDirRefused(
                f"the fallback reports folder {folder} is not a folder of this user (uid {found.st_uid}); "
                "expected the node's own: remove it"
            )
        os.chmod(folder, mode)  # mkdir's mode passes through the umask
    except OSError as exc:
        raise RuntimeDirRefused(f"cannot create the fallback reports folder {folder}: {exc}") from None


class FallbackRows(Collector):
    """Reads the reports folder at each collection and exports the totals."""

    def __init__(self, folder: Path, retention_s: float = REPORT_RETENTION_S) -> None:
        self.folder = folder
        self.retention_s = retention_s
        self._trusted = frozenset({os.geteuid(), 0})
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], int] = {}
        """(file name, model) -> its rows at the last read."""
        self._totals: dict[tuple[str, str, str], int] = {}
        """(model, application, owner) -> rows."""
        self._last_read: dict[str, str] = {}
        """The name of the last report read, of the node's user and of the others."""
        self._removed: list[tuple[Path, str]] = []
        """Files removed during this collection, and why: logged once at its end."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            self._read_reports()
            totals = dict(self._totals)
        family = CounterMetricFamily(
            "udfserve_client_fallback_rows",
            "Rows the Spark clients' CPU fallback answered on this node (reported by the clients), by "
            "model, Spark application and owner (node: the node's own user or root; other: another user).",
            labels=["model", "application", "owner"],
        )
        for (model, application, owner), rows in sorted(totals.items()):
            family.add_metric([model, application, owner], rows)
        yield family

    def _read_reports(self) -> None:
        now = time.time()
        names, complete = self._scan(now)
        ours = sorted(name for name, uid in names.items() if uid in self._trusted)
        theirs: list[str] = []
        per_user: dict[int, int] = {}
        for name in sorted(set(names) - set(ours)):
            uid = names[name]
            per_user[uid] = per_user.get(uid, 0) + 1
            if per_user[uid] > MAX_REPORTS_PER_OTHER_USER:
                self._remove(
                    self.folder / name, f"uid {uid} has more than {MAX_REPORTS_PER_OTHER_USER} reports"
                )
            else:
                theirs.append(name)
        budget = MAX_REPORT_FILES
        for group, group_names in (("node", ours), ("other", theirs)):
            # each scrape goes on after the last report it read, so that every report is read in turn
            turn = _after(group_names, self._last_read.get(group, ""))[:budget]
            for name in turn:
                self._read_one(name, now)
            if turn:
                self._last_read[group] = turn[-1]
            budget -= len(turn)
        # forget the files that are gone (their counts stay in the totals); a scan cut short saw
        # only some names, and forgets nothing unless what it remembers outgrew its bound
        if complete or len(self._seen) > MAX_REMEMBERED:
            self._seen = {key: rows for key, rows in self._seen.items() if key[0] in names}
        if self._removed:  # one line a scrape, however many files a user put there
            (path, why), count = self._removed[0], len(self._removed)
            logger.warning(
                "removed %d file(s) from the fallback reports folder (first: %s: %s)", count, path, why
            )
            self._removed = []

    def _scan(self, now: float) -> tuple[dict[str, int], bool]:
        """The report names of the folder and the uid each names (at most ``MAX_SCANNED_ENTRIES``
        entries looked at, and whether that was all of them); a name that is not a report's is
        removed, and a temporary file left over a minute."""
        names: dict[str, int] = {}
        try:
            entries = os.scandir(self.folder)
        except OSError as exc:
            logger.debug("cannot read the fallback reports folder %s: %s", self.folder, exc)
            return names, False
        with entries:
            for scanned, entry in enumerate(entries):
                if scanned >= MAX_SCANNED_ENTRIES:
                    return names, False
                if entry.name.startswith("."):
                    self._remove_if_abandoned(entry.path, now)  # a report being written, or left
                    continue
                matched = REPORT_NAME.fullmatch(entry.name)
                if matched is None:
                    self._remove(Path(entry.path), "not named <uid>-<16 hex digits>.json")
                    continue
                names[entry.name] = int(matched["uid"])
        return names, True

    def _read_one(self, name: str, now: float) -> None:
        path = self.folder / name
        try:
            uid, application, counts = read_report(self.folder, name)
        except FileNotFoundError:
            return
        except ReportRefused as exc:
            self._remove(path, str(exc))
            return
        owner = "node" if uid in self._trusted else "other"
        for model, rows in counts.items():
            before = self._seen.get((name, model), 0)
            gained = rows - before if rows >= before else rows
            self._seen[(name, model)] = rows
            if gained:
                self._add(model, application, owner, gained)
        try:
            if now - path.stat().st_mtime > self.retention_s:
                path.unlink(missing_ok=True)
        except OSError:
            pass

    def _remove(self, path: Path, why: str) -> None:
        path.unlink(missing_ok=True)
        self._removed.append((path, why))

    @staticmethod
    def _remove_if_abandoned(path: str, now: float) -> None:
        """A temporary file is replaced within milliseconds; one older than a minute was left by a
        writer that died, or put there to take up a scrape's reads: removed."""
        try:
            if now - os.lstat(path).st_mtime > TEMPORARY_RETENTION_S:
                os.unlink(path)
        except OSError:
            pass

    def _add(self, model: str, application: str, owner: str, rows: int) -> None:
        key = (model, application, owner)
        if key not in self._totals and len(self._totals) >= MAX_FALLBACK_SERIES:
            key = (OVERFLOW, OVERFLOW, owner)
        self._totals[key] = self._totals.get(key, 0) + rows


def _after(names: list[str], last: str) -> list[str]:
    """``names`` (sorted) from the first after ``last``, then round to the start."""
    cut = bisect.bisect_right(names, last)
    return names[cut:] + names[:cut]
