"""The Hugging Face text classifier end to end: a Spark string column in, class probabilities out.

The model is a fine-tuned folder made here (``udfserve.services.examples.text_classifier``) imported with
``models import-hf`` as a user's model is, to ONNX (served by ONNX Runtime) and to torch.export
(served by PyTorch). The server tokenizes; the executors send text, and each row's answer equals
what transformers computes in-process for that text, tokenized by transformers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_data import stacked

from udfserve.services.examples.text_classifier import MAX_LENGTH, generated_texts, write_fine_tuned_folder
from udfserve.services.hf_import import import_hugging_face
from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, arrow_predictor, remote_predict

ROWS = 100_000
DISTINCT_TEXTS = 8_000
"""Rows repeat texts of this many: transformers' in-process answers (the reference, minutes of
CPU for 100,000 texts on a busy 2-core machine) are computed once per distinct text."""
TOLERANCE = 1e-5
MODELS = {"onnx": "reviews_onnx", "pt2": "reviews_pt2"}
FRAMEWORK_MODULES = {"tensorflow", "keras", "torch", "transformers", "tokenizers", "onnxruntime"}
SERVER_PACKAGE = "udfserve.services"


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fine_tuned_folder(tmp_path_factory.mktemp("hf") / "fine_tuned")


@pytest.fixture(scope="module")
def text_repository(fine_tuned: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("text_repository")
    for model_format, name in MODELS.items():
        import_hugging_face(fine_tuned, root, name, model_format=model_format, max_length=MAX_LENGTH)  # type: ignore[arg-type]
    return root


@pytest.fixture(scope="module")
def text_server(text_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("text_server")
    process = launch_server(
        text_repository, socket=folder / "grpc.sock", port=0, http_port=0, log_path=folder / "server.log"
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """100,000 texts: generated sentences, and every 1,000th row an edge (empty, beyond the
    tokenizer's words, longer than max_length)."""
    distinct = generated_texts(DISTINCT_TEXTS, seed=21)
    picks = np.random.default_rng(21).integers(0, DISTINCT_TEXTS, ROWS)
    values = [distinct[pick] for pick in picks]
    for row in range(0, ROWS, 1_000):
        values[row] = ("", "zyzzyva qwerty ✓", "good " * 300)[(row // 1_000) % 3]
    return values


@pytest.fixture(scope="module")
def expected(fine_tuned: Path, texts: list[str]) -> np.ndarray:
    distinct, row_of_text = np.unique(np.array(texts, dtype=object), return_inverse=True)
    return transformers_probabilities(fine_tuned, list(distinct))[row_of_text]


def transformers_probabilities(folder: Path, texts: Sequence[str]) -> np.ndarray:
    """The fine-tuned model run in-process by transformers, tokenized by transformers. Texts of
    similar lengths are batched together (padding is masked: the answers do not depend on it),
    which makes 100,000 texts several times faster to score than in their own order."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    order = np.argsort([len(text) for text in texts], kind="stable")
    result = np.empty((len(texts), model.config.num_labels), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(texts), 1024):
            rows = order[start : start + 1024]
            batch = tokenizer(
                [texts[row] for row in rows],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="pt",
            )
            result[rows] = torch.softmax(model(**batch).logits, dim=-1).numpy()
    return result


def text_frame(spark: SparkSession, texts: Sequence[str], partitions: int = 4) -> DataFrame:
    pdf = pd.DataFrame({"id": np.arange(len(texts), dtype=np.int64), "text": list(texts)})
    return spark.createDataFrame(pdf).repartition(partitions)


def scored(frame: DataFrame, model: str, config: ClientConfig, udf_type: str = "pandas") -> pd.DataFrame:
    predict = remote_predict(model, udf_type=udf_type, config=config)  # type: ignore[arg-type]
    result = frame.select("id", predict("text").alias("p")).toPandas().sort_values("id")
    return result


@pytest.mark.slow
@pytest.mark.parametrize("model_format", list(MODELS))
def test_100000_strings_scored_through_the_server_equal_transformers_in_process(
    spark: SparkSession,
    text_server: ServerProcess,
    texts: list[str],
    expected: np.ndarray,
    model_format: str,
) -> None:
    config = ClientConfig(address=text_server.grpc_target(), fallback="error")
    predict = remote_predict(MODELS[model_format], config=config)

    result = text_frame(spark, texts).select("id", predict("text").alias("p")).toPandas().sort_values("id")

    assert np.array_equal(result["id"].to_numpy(), np.arange(ROWS))
    np.testing.assert_allclose(stacked(result["p"]), expected, atol=TOLERANCE)
    assert predict.stats().rows_by_server == ROWS


@pytest.mark.parametrize("udf_type", ["pandas", "arrow"])
def test_the_cpu_fallback_tokenizes_and_answers_as_the_server_does(
    spark: SparkSession,
    text_repository: Path,
    texts: list[str],
    expected: np.ndarray,
    tmp_path: Path,
    udf_type: str,
) -> None:
    config = ClientConfig(
        address=f"unix://{tmp_path / 'no-server.sock'}", model_repository=str(text_repository)
    )

    result = scored(text_frame(spark, texts[:20_000], partitions=2), MODELS["onnx"], config, udf_type)

    assert np.array_equal(result["id"].to_numpy(), np.arange(20_000))
    np.testing.assert_allclose(stacked(result["p"]), expected[:20_000], atol=TOLERANCE)


def test_a_worker_scoring_text_through_the_server_imports_no_framework_and_no_tokenizer(
    fresh_python_workers: None, spark: SparkSession, text_server: ServerProcess, texts: list[str]
) -> None:
    """As tests/spark/test_lightness.py, with the text model: the fallback is off, so no
    in-process model can have answered instead."""
    predictor = arrow_predictor(
        MODELS["onnx"], config=ClientConfig(address=text_server.grpc_target(), fallback="error")
    )

    def predict_then_list_heavy_modules(batches: Iterator[object]) -> Iterator[object]:
        import sys

        import pyarrow as pa

        for batch in predictor(batches):  # type: ignore[arg-type]
            heavy = sorted(
                name
                for name in sys.modules
                if name.split(".")[0] in FRAMEWORK_MODULES or name.startswith(SERVER_PACKAGE)
            )
            yield batch.append_column("heavy_modules", pa.array([",".join(heavy)] * batch.num_rows))

    frame = text_frame(spark, texts[:10_000], partitions=2)
    schema = T.StructType(
        [*frame.schema.fields, *predictor.output_fields(), T.StructField("heavy_modules", T.StringType())]
    )
    rows = (
        frame.mapInArrow(predict_then_list_heavy_modules, schema).select("heavy_modules").distinct().collect()
    )

    assert [row.heavy_modules for row in rows] == [""]


def test_a_null_string_is_refused_naming_the_column_and_row(
    spark: SparkSession, text_server: ServerProcess
) -> None:
    """A null is not a text: refused (INVALID_ARGUMENT, never the fallback), not scored as ""."""
    config = ClientConfig(address=text_server.grpc_target())
    frame = spark.range(1_000, numPartitions=1).select(
        "id", F.when(F.col("id") == 700, None).otherwise(F.lit("a fine movie")).alias("text")
    )

    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*'text'.*null row 700\b"):
        frame.select(remote_predict(MODELS["onnx"], config=config)("text")).collect()


def test_a_column_that_is_not_text_is_refused_naming_the_string_input(
    spark: SparkSession, text_server: ServerProcess
) -> None:
    config = ClientConfig(address=text_server.grpc_target())
    frame = spark.range(100, numPartitions=1).select(F.col("id").alias("text"))

    with pytest.raises(Exception, match=r"'text'.*string"):
        frame.select(remote_predict(MODELS["onnx"], config=config)("text")).collect()


def test_strings_scored_over_kserve_equal_transformers_in_process(
    spark: SparkSession, text_server: ServerProcess, texts: list[str], expected: np.ndarray
) -> None:
    """KServe's BYTES tensors carry the same texts: the server tokenizes them alike."""
    config = ClientConfig(address=text_server.grpc_target(), fallback="error", protocol="kserve")

    result = scored(text_frame(spark, texts[:5_000], partitions=2), MODELS["onnx"], config)

    assert np.array_equal(result["id"].to_numpy(), np.arange(5_000))
    np.testing.assert_allclose(stacked(result["p"]), expected[:5_000], atol=TOLERANCE)


@pytest.fixture
def own_text_server(text_repository: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the ONNX text model (the one the test scores, so no PyTorch loads) for one
    test, which the test kills."""
    process = launch_server(
        text_repository,
        socket=tmp_path / "grpc.sock",
        port=0,
        http_port=0,
        log_path=tmp_path / "server.log",
        extra_args=["--models", MODELS["onnx"]],
    )
    yield process
    process.kill()


@pytest.mark.slow
def test_a_text_server_killed_mid_job_leaves_every_row_answered_once_by_it_or_the_fallback(
    spark: SparkSession,
    own_text_server: ServerProcess,
    text_repository: Path,
    texts: list[str],
    expected: np.ndarray,
    tmp_path: Path,
) -> None:
    """A step after the prediction SIGKILLs the server when the first answered batch reaches it
    (once: a marker file only one worker can create), with most of the job's 100,000 rows still
    to go; the rows the server had not answered are tokenized and scored by the CPU fallback,
    each exactly once."""
    pid, marker = own_text_server.pid, str(tmp_path / "killed")

    def kill_server_at_first_batch(batches: Iterator[object]) -> Iterator[object]:
        import os
        import signal

        for batch in batches:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(pid, signal.SIGKILL)
            yield batch

    config = ClientConfig(
        address=own_text_server.grpc_target(), model_repository=str(text_repository), rows_per_request=1_000
    )
    predict = remote_predict(MODELS["onnx"], config=config)
    predicted = text_frame(spark, texts, partitions=2).select("id", predict("text").alias("p"))
    result = predicted.mapInArrow(kill_server_at_first_batch, predicted.schema).toPandas()

    assert own_text_server.process.wait(timeout=30) == -9
    ids = result["id"].to_numpy()
    assert len(ids) == ROWS and len(np.unique(ids)) == ROWS
    result = result.sort_values("id")
    np.testing.assert_allclose(stacked(result["p"]), expected, atol=TOLERANCE)
    stats = predict.stats()
    assert stats.rows_by_server + stats.rows_by_fallback == ROWS
    assert stats.rows_by_server > 0 and stats.rows_by_fallback > 0, stats
