"""The priority classes a server offers Spark applications, as ``--priority-classes`` writes them.

``interactive=8,default=2,batch=1``: a class name a client may name (``spark.udfserve.priorityClass``)
and the weight the server gives it (``core.shares``). Only this table gives weights, so a client
can claim no more than the server grants.
"""

from __future__ import annotations

import re

PRIORITY_CLASS_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
MAX_PRIORITY_WEIGHT = 1000


def parse_priority_classes(items: tuple[str, ...]) -> dict[str, int]:
    """``("interactive=8", "batch=1")`` as ``{"interactive": 8, "batch": 1}``; ``ValueError``
    naming the item that is not ``name=weight`` with a lower-case name and a weight of 1 to 1000."""
    weights: dict[str, int] = {}
    for item in items:
        name, _, weight = item.partition("=")
        name, weight = name.strip(), weight.strip()
        if not PRIORITY_CLASS_NAME.fullmatch(name) or not weight.isdigit():
            raise ValueError(
                f"priority class {item!r} is not 'name=weight'; expected a lower-case name of letters, "
                "digits, '-' or '_' (at most 32) and a whole weight, such as 'interactive=8'"
            )
        if not 1 <= int(weight) <= MAX_PRIORITY_WEIGHT:
            raise ValueError(f"priority class {item!r}: expected a weight from 1 to {MAX_PRIORITY_WEIGHT}")
        if name in weights:
            raise ValueError(f"priority class {name!r} is given twice")
        weights[name] = int(weight)
    if not weights:
        raise ValueError("expected at least one priority class, such as 'default=1'")
    return weights
