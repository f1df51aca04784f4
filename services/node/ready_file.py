"""What a server serves, as its ready file says, read again whenever the server rewrites it.

A server writes its ready file (``--ready-file``) once listening, again with its models and
their versions once loading has finished, and again whenever its versions change (model
control ``poll`` or ``explicit``: a version published, loaded or unloaded). Each write replaces
the file atomically, so a new inode, modification time or size says it was rewritten: the
supervisor looks at that on every heartbeat and reads the file only when it changed. Asking the
server instead would need its token, and a call per heartbeat per device.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)


class ServedModels(BaseModel):
    """The part of a ready file the node publishes: the models serving and their versions."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    models: list[str] = Field(default_factory=list)
    versions: dict[str, list[int]] = Field(default_factory=dict)
    """Empty in the file of a server from before model control: it lists no versions."""

    def in_order(self) -> ServedModels:
        """Sorted, so that a rewrite that lists the same in another order is no change."""
        return ServedModels(
            models=sorted(self.models),
            versions={name: sorted(v) for name, v in sorted(self.versions.items())},
        )


class ReadyFileWatch:
    """One server's ready file; ``read`` it once the server serves, then ``changed`` per heartbeat."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None

    def read(self) -> ServedModels:
        """The file's models and versions now; OSError or ValueError when it cannot be read."""
        signature = self._signature()  # before reading: a rewrite meanwhile is seen next time
        served = ServedModels.model_validate_json(self.path.read_bytes()).in_order()
        self._seen = signature
        return served

    def changed(self) -> ServedModels | None:
        """The file's models and versions if it was rewritten since the last read, else None.

        A file gone (its server is exiting, which the supervisor learns from the process) or not
        readable is left for the next look."""
        try:
            if self._signature() == self._seen:
                return None
            return self.read()
        except (OSError, ValueError) as exc:
            logger.debug("ready file %s not read this time: %s", self.path, exc)
            return None

    def _signature(self) -> tuple[int, int, int]:
        stat = os.stat(self.path)
        return stat.st_ino, stat.st_mtime_ns, stat.st_size
