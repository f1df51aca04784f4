"""The mode of a server's unix socket when it first appears, under umask 000.

Watches the socket's folder with inotify (Linux) while ``udfserve serve`` starts with umask 000,
and stats every entry the moment the kernel reports it created or moved in. A socket created at
its path and chmod-ed afterwards shows up with mode 0777 (any local user may connect until the
chmod); one bound in a private folder and renamed into place shows up with its ``--socket-mode``.
Not a test: a watcher can be too late to see a short window, so runs are counted.

    python -m benchmarks.socket_first_sight --model-repository ./model_repository --runs 3
"""

from __future__ import annotations

import argparse
import ctypes
import os
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

IN_CREATE = 0x100
IN_MOVED_TO = 0x80
_EVENT_HEADER = struct.Struct("iIII")


def first_sight(repository: Path, model: str) -> list[tuple[str, str, str]]:
    """(event, name, mode at that moment) for each entry of the socket's folder during one start."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    folder = Path(tempfile.mkdtemp(prefix="udfs-sight-"))
    watch_fd = libc.inotify_init()
    if watch_fd < 0 or libc.inotify_add_watch(watch_fd, str(folder).encode(), IN_CREATE | IN_MOVED_TO) < 0:
        raise OSError(ctypes.get_errno(), "inotify is not available")
    seen: list[tuple[str, str, str]] = []

    def watch() -> None:
        while True:
            data = os.read(watch_fd, 4096)
            offset = 0
            while offset < len(data):
                _, mask, _, length = _EVENT_HEADER.unpack_from(data, offset)
                start = offset + _EVENT_HEADER.size
                name = data[start : start + length].rstrip(b"\0").decode()
                offset = start + length
                try:
                    mode = oct(stat.S_IMODE(os.lstat(folder / name).st_mode))
                except FileNotFoundError:
                    mode = "gone"
                seen.append(("created" if mask & IN_CREATE else "moved in", name, mode))

    threading.Thread(target=watch, daemon=True).start()
    ready = folder / "ready.json"
    command = [
        sys.executable, "-m", "udfserve", "serve", "--model-repository", str(repository),
        "--models", model, "--socket", str(folder / "server.sock"), "--port", "off",
        "--http-port", "off", "--ready-file", str(ready),
    ]  # fmt: skip
    server = subprocess.Popen(command, umask=0, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        while not ready.exists() and server.poll() is None:
            time.sleep(0.05)
        time.sleep(0.5)  # the watcher's last events
    finally:
        server.terminate()
        server.wait(60)
        os.close(watch_fd)
    return [event for event in seen if not event[1].startswith((".ready", "ready"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--model", default="tabular_mlp", help="the one model the server loads")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    wide = 0
    for run in range(1, args.runs + 1):
        events = first_sight(args.model_repository, args.model)
        socket_modes = [mode for _, name, mode in events if name == "server.sock"]
        wide += any(mode not in ("0o600", "gone") for mode in socket_modes)
        print(f"run {run}: " + "; ".join(f"{name} {event} with mode {mode}" for event, name, mode in events))
    print(f"server.sock seen with a mode wider than 0600: {wide} of {args.runs} runs")


if __name__ == "__main__":
    main()
