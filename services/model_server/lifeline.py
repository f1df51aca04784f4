"""The pipe that ties a model server to the process that started it (``--lifeline-fd``).

``udfserve node`` keeps the write end of one pipe for as long as it lives and hands the read end
to every server it starts. Nothing is ever written: the read end reaches end of file when the
last write end closes, which the kernel does when the supervisor exits, however it exits
(SIGKILL and a crash included). The server then drains and exits as on SIGTERM, so a killed
supervisor leaves no orphan servers holding the node's sockets, ports and devices.

A pipe rather than Linux's ``PR_SET_PDEATHSIG``: it works on every POSIX system; it follows the
death of the supervisor process, not of the thread that happened to start the child; and a
supervisor that died before the server began to watch leaves a pipe already at end of file, so
there is no window between the start and the watch to close.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable

logger = logging.getLogger(__name__)


def watch_lifeline(fd: int, on_closed: Callable[[], None]) -> None:
    """Call ``on_closed`` once, on the running event loop, when the pipe ``fd`` reaches end of
    file (every write end closed: the process that started this one is gone).

    Raises ``OSError`` naming the flag when ``fd`` is not an open pipe of this process."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        raise OSError(
            f"--lifeline-fd {fd} is not an open file descriptor of this process: {exc.strerror}"
        ) from None
    if not stat.S_ISFIFO(mode):
        raise OSError(f"--lifeline-fd {fd} is not a pipe; expected the read end of a pipe held by the parent")
    os.set_blocking(fd, False)
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return  # nothing is written on purpose; only the end of file means something
        loop.remove_reader(fd)
        os.close(fd)
        on_closed()

    loop.add_reader(fd, readable)
