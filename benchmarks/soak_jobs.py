"""The Spark side of the soak: one Spark application that runs jobs back to back until a deadline.

    python -m benchmarks.soak_jobs '{"deadline": ..., "datasets": {...}, "results_file": ...}'

Each job reads one model's parquet files, predicts through one of the client's three ways
(``remote_predict`` as a pandas UDF, ``remote_predict(udf_type='arrow')``, ``predict_arrow``)
and aggregates what came out in one action: the count of rows, of distinct ids, the least and
greatest id, the sum of the ids, and the rows whose prediction is missing or of the wrong width.
Ids run from 0 to n-1, so every row arrived exactly once when those are n, n, 0, n-1,
n(n-1)/2 and 0. One JSON line per job is appended to ``results_file`` as it finishes, so the
jobs done so far survive a crash of this process.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.spark_job import MODELS, Job, _predicted, _session

logger = logging.getLogger(__name__)

KINDS = ("remote_predict", "remote_predict_arrow", "predict_arrow")
"""The client's three ways, under the names ``benchmarks.spark_job`` gives them."""
MAX_FAILURES_IN_A_ROW = 3
"""An application whose jobs keep failing is broken (its JVM gone, say): stop it rather than spin."""


@dataclass
class Plan:
    """What one application runs: jobs cycling over the models and the kinds until ``deadline``."""

    deadline: float
    """Seconds since the epoch: no job starts after it (but see ``min_jobs``)."""
    datasets: dict[str, str]
    """Model -> parquet folder holding ids 0..rows-1."""
    rows: dict[str, int]
    results_file: str
    client_settings: dict[str, Any] = field(default_factory=dict)
    application: int = 0
    first_job: int = 0
    """Index of this application's first job in the whole soak, so that the cycle goes on."""
    min_jobs: int = 0
    """Jobs still start after ``deadline`` until the soak has run this many in all: a short run
    (``--quick``) still runs every model and kind, however slowly a loaded machine starts Spark."""


@dataclass
class JobCheck:
    """One job's outcome: what its rows added up to, or its error."""

    index: int
    application: int
    model: str
    kind: str
    started_at: float
    duration_s: float
    expected_rows: int
    rows: int = 0
    distinct_ids: int = 0
    min_id: int | None = None
    max_id: int | None = None
    sum_ids: int | None = None
    bad_predictions: int = 0
    """Rows whose prediction is null or not of the model's output width."""
    error: str | None = None

    @property
    def exactly_once(self) -> bool:
        n = self.expected_rows
        return (
            self.error is None
            and self.rows == n
            and self.distinct_ids == n
            and self.min_id == 0
            and self.max_id == n - 1
            and self.sum_ids == n * (n - 1) // 2
        )

    @property
    def passed(self) -> bool:
        return self.exactly_once and self.bad_predictions == 0


def job_at(index: int, models: Sequence[str]) -> tuple[str, str]:
    """The model and kind of the soak's ``index``-th job: two models and three kinds interleave,
    so every pair comes round once in six jobs (with two models)."""
    return models[index % len(models)], KINDS[index % len(KINDS)]


def run_one(spark: Any, plan: Plan, index: int) -> JobCheck:
    from pyspark.sql import functions as F

    model, kind = job_at(index, sorted(plan.datasets))
    _, _, _, width = MODELS[model]
    check = JobCheck(index, plan.application, model, kind, time.time(), 0.0, plan.rows[model])
    started = time.perf_counter()
    try:
        job = Job(contender=kind, model=model, client_settings=plan.client_settings)
        predicted = _predicted(spark, spark.read.parquet(plan.datasets[model]), job)
        prediction = F.col("prediction")
        bad = F.when(prediction.isNull() | (F.size(prediction) != width), 1).otherwise(0)
        row = predicted.agg(
            F.count(F.lit(1)).alias("rows"),
            F.countDistinct("id").alias("distinct_ids"),
            F.min("id").alias("min_id"),
            F.max("id").alias("max_id"),
            F.sum("id").alias("sum_ids"),
            F.sum(bad).alias("bad_predictions"),
        ).first()
        check.rows, check.distinct_ids = int(row["rows"]), int(row["distinct_ids"])
        check.min_id, check.max_id, check.sum_ids = row["min_id"], row["max_id"], row["sum_ids"]
        check.bad_predictions = int(row["bad_predictions"] or 0)
    except Exception:  # a failed job is a result of the soak: record it and go on
        check.error = traceback.format_exc()[-3000:]
    check.duration_s = time.perf_counter() - started
    return check


def _more_jobs(plan: Plan, index: int) -> bool:
    """Whether the ``index``-th job of the soak starts: before the deadline, or while the soak
    has run fewer than ``min_jobs``."""
    return time.time() < plan.deadline or index < plan.min_jobs


def run_plan(plan: Plan) -> int:
    """Run jobs until the deadline; the number of jobs run."""
    spark = _session(Job(contender=f"soak-{plan.application}", model=""))
    index, failures_in_a_row = plan.first_job, 0
    with open(plan.results_file, "a", encoding="utf-8") as results:
        while _more_jobs(plan, index) and failures_in_a_row < MAX_FAILURES_IN_A_ROW:
            check = run_one(spark, plan, index)
            results.write(json.dumps(asdict(check)) + "\n")
            results.flush()
            failures_in_a_row = 0 if check.error is None else failures_in_a_row + 1
            logger.info(
                "job %d (%s, %s): %s in %.1f s", index, check.model, check.kind,
                "passed" if check.passed else "FAILED", check.duration_s,
            )  # fmt: skip
            index += 1
    spark.stop()
    return index - plan.first_job


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    run_plan(Plan(**json.loads(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
