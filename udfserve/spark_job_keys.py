"""The gRPC metadata that tells a server which Spark job a stream belongs to.

The Spark client writes these keys on every stream; the server reads them for labels only.
Both sides take the keys and the length bounds from here, so they cannot drift apart.
"""

from __future__ import annotations

METADATA_PREFIX = "udfserve-spark-"

MAX_VALUE_CHARS = {
    "app-id": 128,
    "app-name": 128,
    "job-group": 128,
    "job-description": 256,
    "stage-id": 12,
    "partition-id": 12,
    "task-attempt": 12,
    "priority-class": 32,
}
"""Longest value the server accepts for each key (after the prefix); the client cuts to it."""

NUMERIC_KEYS = frozenset({"stage-id", "partition-id", "task-attempt"})
"""Keys whose values must be decimal digits."""
