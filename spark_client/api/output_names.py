"""The names of the columns a UDF appends, checked in the driver against what Spark can tell apart.

``predict_arrow`` appends outputs to a DataFrame's columns and ``predict_files`` to the files'
kept columns; Spark compares names without case unless ``spark.sql.caseSensitive`` is set, so a
clash that Python's ``==`` misses would surface as an ambiguous column later, far from its cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_output_names(existing: Sequence[str], outputs: Sequence[str], spark: Any, where: str) -> None:
    """Raise ``ValueError`` when Spark could not tell the appended ``outputs`` apart from each other
    or from the ``existing`` columns (compared with or without case, as ``spark.sql.caseSensitive``
    says); ``where`` says where the existing columns come from, for the message."""
    case_sensitive = str(spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"

    def key(name: str) -> str:
        return name if case_sensitive else name.lower()

    repeated = sorted({c for c in outputs if [key(o) for o in outputs].count(key(c)) > 1})
    if repeated:
        raise ValueError(f"output column(s) {repeated} are named twice; expected one name per output")
    taken = {key(c) for c in existing}
    clash = [c for c in outputs if key(c) in taken]
    if clash:
        raise ValueError(
            f"output column(s) {clash} already exist {where} (its columns are {list(existing)}; Spark "
            f"compares names {'with' if case_sensitive else 'without'} case, spark.sql.caseSensitive); "
            "name them output_columns=..., or rename (or leave out) the clashing columns"
        )
