"""Start a command detached from the process that asks for it: ``python -m
udfserve.services.node.detached --log-file PATH -- COMMAND...``.

A Spark task that starts its host's node (``udfserve.spark_client.node_servers``) runs in a
Python worker that Spark reuses for other tasks, or ends with its task, and whose process group
Spark may signal. The node must outlive all of that: this helper forks, the child starts a
session of its own (no controlling terminal, its own process group), puts its standard input on
``/dev/null`` and its output on the log file (appended), and execs the command; the helper
prints the child's pid and exits at once. The caller reaps the helper, and the node, whose
parent is gone, is the init process's (or the nearest subreaper's) to reap when it exits: a
container whose first process reaps no orphans (a JVM started as pid 1) keeps it as a zombie
then, holding no resource but its pid; run such containers with an init (``docker run
--init``, tini).

Descriptors the caller passed on (``subprocess``'s ``pass_fds``: the start lock) stay open in
the command; every other one is closed by ``subprocess`` before this helper runs. A separate
process rather than a fork of the Python worker: the worker may hold gRPC threads, and a fork of
a threaded process is unsafe; this helper has none.
"""

from __future__ import annotations

import argparse
import os
import sys

LOG_FILE_MODE = 0o600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m udfserve.services.node.detached",
        description="Run a command in a session of its own, its output appended to a log file; "
        "print its pid.",
    )
    parser.add_argument("--log-file", required=True, help="file the command's stdout and stderr go to")
    parser.add_argument("--cwd", default="/", help="the command's working folder (default: /)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("expected a command after --")
    log_fd = os.open(args.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, LOG_FILE_MODE)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.chdir(args.cwd)
            os.dup2(null_fd, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(log_fd, f"cannot start {command[0]}: {exc}\n".encode())
        os._exit(127)
    sys.stdout.write(f"{pid}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
