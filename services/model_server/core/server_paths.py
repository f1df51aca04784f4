"""What a client reads of the server's files: paths relative to the model repository.

A load error names the file that failed, and the operator's log keeps its absolute path; the
copies clients read (a model's metadata and index, a load call's status, the admin app) name it
from the repository down, so an unauthenticated reader learns which file failed, not the server's
layout.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_ABSOLUTE_PATH = re.compile(r"(?<![^\s'\"(=\[])/(?:[^\s'\"/:,;()]+/)+([^\s'\"/:,;()]*)")
"""An absolute path: a ``/`` at the start or after a space, quote, bracket or ``=`` (never inside
a word, so the layout ``<repo>/<model>/config.yaml`` of a message stays as it is)."""


def without_server_paths(text: str, repository: Path) -> str:
    """``text`` with paths inside the repository made relative to it and any other absolute path
    cut to its last name; "the repository <root>" reads "the repository"."""
    for root in dict.fromkeys((str(repository.resolve()), str(repository.absolute()))):
        named = f"repository {root}"
        text = text.replace(named + os.sep, "repository ").replace(named, "repository")
        text = text.replace(root + os.sep, "").replace(root, ".")
    return _ABSOLUTE_PATH.sub(r"\1", text)
