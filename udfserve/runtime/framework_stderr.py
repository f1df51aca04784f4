"""What a framework's C++ code prints on stderr while it starts, without the lines that are no
concern of the user.

TensorFlow's libraries log through absl, and every message logged before
``absl::InitializeLog()`` goes to stderr whatever ``TF_CPP_MIN_LOG_LEVEL`` says: on every start
a CPU-only machine shows its oneDNN notice, "Could not find cuda drivers", the CPU instruction
notice, and an ``E0000 ... failed call to cuInit`` line that reads like an error although the
process hid the GPUs on purpose. Those lines are written to file descriptor 2 by C++, out of
reach of Python's ``logging``; so while the framework is imported and enumerates its devices,
descriptor 2 is a pipe whose lines are passed on (as they come, so a crash still shows them)
unless ``ChatterFilter`` drops them:

- an absl line below the process's ``TF_CPP_MIN_LOG_LEVEL`` (0 info, 1 warning, 2 error,
  3 fatal), which is what TensorFlow itself promises for that setting, and the line that
  continues it (the CPU instruction notice spans two);
- absl's own "All log messages before absl::InitializeLog()" notice, with any level above 0;
- the failed ``cuInit`` when the GPUs are hidden (``CUDA_VISIBLE_DEVICES`` empty) and the level
  is above 0: on a device meant to be a GPU the same line is the reason the GPU is missing, and
  is kept.

Every other line, Python's own output included, passes unchanged. Nothing here changes the
environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping

ABSL_LINE = re.compile(r"^(?P<severity>[IWEF])\d{4} [\d:.]+\s+\d+ (?P<source>[^\]\s]+)\] ")
"""The head of an absl log line: severity, date (``0000`` before absl knows the time), time,
thread, ``file.cc:line]``."""

ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"

OWN_LOG_LINE = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\{"time": ")')
"""A line of this process's own log, in either format (text, or a JSON object whose first field
is its time): never the continuation of a framework message."""

_SEVERITY_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}

FORWARDER_JOIN_S = 5.0
"""How long the end of the block waits for the forwarder to pass the last lines on."""


class ChatterFilter:
    """Decides, line by line, what of a framework's start-up output is passed on."""

    def __init__(self, min_log_level: int, gpus_hidden: bool) -> None:
        self.min_log_level = min_log_level
        self.gpus_hidden = gpus_hidden
        self.dropped = 0
        self._dropping_message = False

    def keep(self, line: str) -> bool:
        """Whether ``line`` (without its newline) is passed on."""
        head = ABSL_LINE.match(line)
        if head is None:
            if line.startswith(ABSL_PREAMBLE):
                keep = self.min_log_level == 0
            elif self._dropping_message and line and not OWN_LOG_LINE.match(line):
                keep = False  # the rest of a message already dropped
            else:
                keep = True
            self._dropping_message = self._dropping_message and not keep
        else:
            keep = not self._is_chatter(head["severity"], line[head.end() :])
            self._dropping_message = not keep
        self.dropped += not keep
        return keep

    def _is_chatter(self, severity: str, message: str) -> bool:
        if _SEVERITY_LEVELS[severity] < self.min_log_level:
            return True
        quiet = self.min_log_level > 0  # 0 asks for everything, as when debugging CUDA itself
        return quiet and self.gpus_hidden and "failed call to cuInit" in message

    def filter_text(self, text: str) -> str:
        """The lines of ``text`` that are kept, each with its newline."""
        return "".join(line + "\n" for line in text.splitlines() if self.keep(line))


def min_log_level(environ: Mapping[str, str]) -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it: an integer, 0 when unset or not a number."""
    try:
        return int(environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


@contextlib.contextmanager
def filtered_stderr(chatter: ChatterFilter) -> Iterator[None]:
    """Within the block, what is written to file descriptor 2 passes through ``chatter``.

    Falls back to no filtering when descriptor 2 cannot be duplicated (a process started
    without stderr).
    """
    try:
        original = os.dup(2)
    except OSError:
        yield
        return
    read_end, write_end = os.pipe()
    forwarder = threading.Thread(
        target=_forward, args=(read_end, original, chatter), name="framework-stderr", daemon=True
    )
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's write end: the forwarder reads to its end
        # A child started within the block holds the write end as its stderr until it exits;
        # the forwarder then keeps passing its lines on, and closes ``original`` itself.
        forwarder.join(timeout=FORWARDER_JOIN_S)


def _forward(read_end: int, destination: int, chatter: ChatterFilter) -> None:
    try:
        with os.fdopen(read_end, "rb") as source:
            for raw in source:
                if chatter.keep(raw.decode(errors="replace").rstrip("\n")):
                    _write_all(destination, raw)
    finally:
        os.close(destination)


def _write_all(destination: int, data: bytes) -> None:
    while data:
        data = data[os.write(destination, data) :]
