"""The options of the JVMs a test starts for seconds: Spark daemons, executors and drivers of its
own applications, and the benchmark scripts' quick runs.

Such a JVM ends before the optimising (C2) compiler's work pays off: its threads spent about 8 of
a small Spark application's 23 CPU-seconds on two cores compiling Spark. With the client compiler
alone (``-XX:TieredStopAtLevel=1``) the same code runs, compiled sooner and more cheaply. The test
session's own SparkSession, which runs every Spark test of a worker, keeps the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def short_lived_jvm_environment(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environment`` (this process's by default) with ``SHORT_LIVED_JVM_OPTIONS`` added to
    ``JAVA_TOOL_OPTIONS``, which every JVM started from it reads, Spark's workers passing it on to
    the executors they launch."""
    base = dict(os.environ if environment is None else environment)
    options = " ".join(o for o in (base.get("JAVA_TOOL_OPTIONS", ""), SHORT_LIVED_JVM_OPTIONS) if o)
    return {**base, "JAVA_TOOL_OPTIONS": options}
