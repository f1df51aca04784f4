"""What the back-pressure comparison runs of a tree's code: its server alone, its demo, and the
demo's Spark job without a model (``benchmarks.text_backpressure`` puts them side by side).

A tree is another checkout of udfserve, run from a tree of links (``scripts/source_tree.py``) on
``PYTHONPATH``, so that its own code serves and scores. The job without a model is the demo's job
(local[2], 2 partitions per core, the same generated text column, Arrow batches of 16,384 rows, a
pandas UDF answering an array of 3 floats per row, a noop write timed after a warm-up write of the
frame and, as the demo's, a warm-up job of 1,024 rows per task slot through the UDF) with a UDF that
answers zeros instead of calling a server: the rows/s the demo's Spark side allows on this machine,
whatever the server does. It runs in a process of its own:

    python -m benchmarks.text_runs <rows>      # prints {"rows_per_s": ..., "seconds": ...}
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa

from benchmarks.client_trees import linked_tree
from benchmarks.processes import metric_value, scrape
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import encode_batch
from udfserve.services.demo_data import TEXT_WORDS
from udfserve.services.model_server.launcher import ServerProcess, launch_server

MODEL = "text_classifier"
REQUEST_ROWS = 4096
"""Rows of one request, as the Spark client sends them (``rows_per_request``)."""
ALONE_IN_FLIGHT = 3
"""Requests the server-alone client keeps outstanding: 12,288 rows, under the model's queue bound."""
REPO_ROOT = Path(__file__).resolve().parent.parent


def demo_texts(rows: int, seed: int = 0) -> list[str]:
    """Sentences as the demo generates them: one word of each group of ``TEXT_WORDS``."""
    rng = np.random.default_rng(seed)
    return [" ".join(str(group[rng.integers(len(group))]) for group in TEXT_WORDS) for _ in range(rows)]


# -- the server alone --------------------------------------------------------------------------
def tree_env(linked: Path) -> dict[str, str]:
    """``PYTHONSAFEPATH``: ``python -m`` puts its working folder first on the path, which from this
    checkout would import this checkout's ``udfserve``, not the linked tree's."""
    return dict(os.environ, PYTHONPATH=str(linked), PYTHONSAFEPATH="1")


async def closed_loop(target: str, duration_s: float) -> tuple[int, float]:
    """One Predict stream keeping ``ALONE_IN_FLIGHT`` requests of ``REQUEST_ROWS`` texts
    outstanding for ``duration_s``, then answered to the last: (rows answered, seconds from the
    first request sent to the last answer)."""
    import grpc

    batch = pa.record_batch({"text": pa.array(demo_texts(REQUEST_ROWS, seed=1))})
    message = pb.PredictRequest(model=MODEL, arrow_ipc=encode_batch(batch))
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream(
            "/udfserve.v1.Inference/Predict",
            request_serializer=pb.PredictRequest.SerializeToString,
            response_deserializer=pb.PredictResponse.FromString,
        )()
        started = time.perf_counter()
        deadline = started + duration_s
        for batch_id in range(ALONE_IN_FLIGHT):
            message.batch_id = batch_id
            await call.write(message)
        sent = ALONE_IN_FLIGHT
        answered = 0
        while answered < sent:
            response = await call.read()
            if response is grpc.aio.EOF or response.HasField("error"):
                raise RuntimeError(f"the server did not answer a request: {response}")
            answered += 1
            if time.perf_counter() < deadline:
                message.batch_id = sent
                sent += 1
                await call.write(message)
        seconds = time.perf_counter() - started
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
    return answered * REQUEST_ROWS, seconds


def server_alone(tree: Path, repository: Path, folder: Path, duration_s: float) -> dict[str, float]:
    """The rows/s ``tree``'s server computes for the model, and the share of it in model calls."""
    name = f"alone-{abs(hash(str(tree)))}"
    server: ServerProcess = launch_server(
        repository,
        socket=folder / f"{name}.sock",
        port=None,
        http_port=0,
        extra_args=["--models", MODEL],
        env=tree_env(linked_tree(tree, folder)),
        log_path=folder / f"{name}.log",
    )
    try:
        target = server.grpc_target(prefer_unix=True)
        asyncio.run(closed_loop(target, min(duration_s, 2.0)))  # warm-up
        process = psutil.Process(server.process.pid)
        before, cpu_before = scrape(server), _cpu_s(process)
        rows, seconds = asyncio.run(closed_loop(target, duration_s))
        after, cpu_s = scrape(server), _cpu_s(process) - cpu_before
    finally:
        server.terminate()
    calls_s = _metric(after, "udfserve_inference_duration_seconds_sum") - _metric(
        before, "udfserve_inference_duration_seconds_sum"
    )
    return {"rows_per_s": rows / seconds, "in_model_calls": calls_s / seconds, "server_cpu": cpu_s / seconds}


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _metric(text: str, name: str) -> float:
    return metric_value(text, name)


# -- the demo ----------------------------------------------------------------------------------
_FIGURES = {
    "seconds": r"^time\s+([\d.]+) s",
    "rows_per_s": r"^throughput\s+([\d,]+) rows/s",
    "batches": r"^answered by servers\s+[\d,]+ rows in ([\d,]+) batches",
    "resends": r"^resends\s+([\d,]+)",
    "waited_s": r"([\d.]+) s waited",
}
_LATER_FIGURES = {
    "room_wait_s": r"^queue room waits\s+[\d,]+ requests held .*?, ([\d.]+) s in all",
    "model_call_s": r"^model calls\s+([\d.]+) s",
}


def run_demo(tree: Path, repository: Path, rows: int, folder: Path) -> tuple[str, dict[str, float]]:
    """``udfserve demo`` of ``tree`` on the text model: its report, and the figures read from it."""
    linked = linked_tree(tree, folder)
    command = [sys.executable, "-m", "udfserve", "demo", "--model", MODEL, "--rows", str(rows)]
    command += ["--model-repository", str(repository)]
    done = subprocess.run(
        command, cwd=folder, env=tree_env(linked), capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the demo of {tree} failed ({done.returncode}): {done.stderr[-4000:]}")
    report = done.stdout[done.stdout.index("udfserve demo report") :].rstrip()
    figures: dict[str, float] = {}
    for key, pattern in _FIGURES.items():
        found = re.search(pattern, report, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no {key} in the demo's report of {tree}:\n{report}")
        figures[key] = float(found.group(1).replace(",", ""))
    for key, pattern in _LATER_FIGURES.items():  # lines a report of an earlier tree may not have
        found = re.search(pattern, report, re.MULTILINE)
        figures[key] = float(found.group(1).replace(",", "")) if found else float("nan")
    # the tasks' time as the issue counted it, for both trees alike: local[2] runs 2 tasks at a time
    figures["waited_share"] = figures["waited_s"] / (figures["seconds"] * 2)
    return report, figures


def spark_floor(rows: int, folder: Path) -> float:
    """Rows/s of the demo's Spark job with no model (``measure``), in a process of its own."""
    command = [sys.executable, "-m", "benchmarks.text_runs", str(rows)]
    done = subprocess.run(
        command,
        cwd=folder,
        env=tree_env(linked_tree(REPO_ROOT, folder)),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the demo's job without a model failed ({done.returncode}): {done.stderr[-4000:]}"
        )
    rate: float = json.loads(done.stdout.strip().splitlines()[-1])["rows_per_s"]
    return rate


# -- the demo's job without a model --------------------------------------------
LABELS = 3
"""Values per answer, as the example text classifier's probabilities."""


def measure(rows: int) -> dict[str, float]:
    import numpy as np
    import pandas as pd
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from udfserve.services.demo_data import input_columns
    from udfserve.spark_client.common.model_spec import Tensor

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("udfserve-demo-floor")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "16384")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:

        def zeros(texts):  # type: ignore[no-untyped-def]  # annotated below with the classes themselves
            return pd.Series(list(np.zeros((len(texts), LABELS), np.float32)))

        # Spark reads a pandas UDF's kind from its annotations, which this module's future import
        # would leave as strings it cannot resolve
        zeros.__annotations__ = {"texts": pd.Series, "return": pd.Series}
        answer = F.pandas_udf(zeros, T.ArrayType(T.FloatType()))  # type: ignore[call-overload]
        frame = spark.range(0, rows, numPartitions=2 * (os.cpu_count() or 2)).select(
            "id", *input_columns([Tensor(name="text", dtype="string", shape=())])
        )
        scored = frame.select("id", answer("text").alias("prediction"))
        frame.write.format("noop").mode("overwrite").save()  # as the demo: the JVM and data path warm
        slots = spark.sparkContext.defaultParallelism  # as the demo's warm-up job: the Python workers start
        warm_up = spark.range(0, 1024 * slots, numPartitions=slots).select(
            *input_columns([Tensor(name="text", dtype="string", shape=())])
        )
        warm_up.select(answer("text")).write.format("noop").mode("overwrite").save()
        started = time.perf_counter()
        scored.write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    return {"rows_per_s": rows / seconds, "seconds": seconds}


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]))))
