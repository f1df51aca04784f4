"""``udfserve completion bash|zsh``: a shell completion script, generated from the command's own parsers.

The script is written once from the argparse parsers by shtab and is plain shell: pressing TAB runs
no Python, where argcomplete would start the interpreter and import the CLI on every press. Commands,
sub-commands and flags complete, and files where a flag takes a path.
"""

from __future__ import annotations

import argparse
import functools
import sys

SHELLS = ("bash", "zsh")

INSTALL_HELP = (
    "bash: `source <(udfserve completion bash)` in ~/.bashrc, or `udfserve completion bash > "
    '/etc/bash_completion.d/udfserve`; zsh: `udfserve completion zsh > "${fpath[1]}/_udfserve"` '
    "(a folder of $fpath), then a new shell"
)


def add_completion_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], root: argparse.ArgumentParser
) -> None:
    """The ``completion`` command, whose script is generated from ``root`` (complete when it runs)."""
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description=f"Print the completion script of udfserve for a shell. To install it: {INSTALL_HELP}.",
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    completion.set_defaults(handler=functools.partial(run_completion, root))


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell``; ValueError when shtab is not installed."""
    try:
        import shtab
    except ImportError:
        raise ValueError(
            "shell completion needs shtab, which is not installed in this environment; expected "
            "`pip install 'udfserve[server]'` (or `pip install shtab`)"
        ) from None
    return str(shtab.complete(parser, shell=shell))


def run_completion(root: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from udfserve.services.settings_cli import SettingsError

    try:
        script = completion_script(root, args.shell)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    sys.stdout.write(script if script.endswith("\n") else script + "\n")
    return 0
