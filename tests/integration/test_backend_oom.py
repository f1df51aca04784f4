"""A real server whose model genuinely runs out of memory above a batch size (TensorFlow's own
allocator fails, see ``oom_model.py``): the batch is split in halves and retried, every row is
answered exactly once and in order, the metrics show the splits and the lowered batch limit, and a
row too big to fit alone fails only its own request, with RESOURCE_EXHAUSTED naming the model and
the row.

The server runs with ``TF_ENABLE_ONEDNN_OPTS=0`` (set for the child process only): TensorFlow then
allocates CPU memory with its plain allocator, which fails at once, instead of the oneDNN BFC
allocator, which retries a failed allocation for 10 s first (as the GPU allocator does). The
behaviour tested is the same; only the waiting differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from oom_model import FEATURES, HUGE_ROW_MARKER, MODEL_NAME
from server_harness import batch_of, metric_value, request, scrape, stream_predict

from udfserve.services.model_server.launcher import ServerProcess, launch_server

pytestmark = pytest.mark.slow

FITS_ROWS = 10
MAX_BATCH_SIZE = 64
FIRST_LIMIT_ROWS = 8  # 64 -> 32 -> 16 run out of memory; 8 fits


@pytest.fixture(scope="module")
def oom_server(socket_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("oom-repository")
    subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("oom_model.py")),
            str(repository),
            str(FITS_ROWS),
            str(MAX_BATCH_SIZE),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    process = launch_server(
        repository,
        socket=socket_dir / "oom.sock",
        env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0"},
        log_path=repository.parent / "oom-server.log",
    )
    yield process
    assert process.terminate() == 0


def features(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(rows, FEATURES)).astype(np.float32)


def expected(x: np.ndarray) -> np.ndarray:
    return 2.0 * x.sum(axis=1, dtype=np.float32)


def oom_metrics(server: ServerProcess) -> dict[str, float]:
    text = scrape(server.http_address or "")
    return {
        name: metric_value(text, name, model=MODEL_NAME)
        for name in ("udfserve_oom_splits_total", "udfserve_backend_oom_total", "udfserve_batch_limit_rows")
    }


@dataclass
class FirstBurst:
    """The first requests the server ever ran for the model, and the metrics before and after."""

    inputs: dict[int, np.ndarray]
    answers: dict[int, object]
    before: dict[str, float]
    after: dict[str, float]


@pytest.fixture(scope="module")
def first_burst(oom_server: ServerProcess) -> FirstBurst:
    """One stream of requests adding up to more rows than fit: 64, then smaller ones merged."""
    inputs = {0: features(MAX_BATCH_SIZE, 0), **{i: features(3 + i, i) for i in range(1, 12)}}
    before = oom_metrics(oom_server)
    answers = stream_predict(
        oom_server.grpc_target(),
        [request(MODEL_NAME, batch_of({"features": x}), i) for i, x in inputs.items()],
    )
    return FirstBurst(inputs, dict(answers), before, oom_metrics(oom_server))


def test_every_row_of_batches_that_do_not_fit_is_answered_exactly_once_in_order(
    first_burst: FirstBurst,
) -> None:
    assert sorted(first_burst.answers) == sorted(first_burst.inputs)
    for batch_id, x in first_burst.inputs.items():
        answer = first_burst.answers[batch_id]
        assert answer.code == grpc.StatusCode.OK, answer.message  # type: ignore[attr-defined]
        got = answer.outputs.column("doubled_sum").to_numpy()  # type: ignore[attr-defined]
        np.testing.assert_allclose(got, expected(x), rtol=1e-5, atol=1e-5)


def test_out_of_memory_splits_and_the_lowered_limit_are_in_the_metrics(first_burst: FirstBurst) -> None:
    assert first_burst.before == {
        "udfserve_oom_splits_total": 0.0,
        "udfserve_backend_oom_total": 0.0,
        "udfserve_batch_limit_rows": float(MAX_BATCH_SIZE),
    }
    assert first_burst.after["udfserve_oom_splits_total"] >= 3  # 64, 32 and 16 rows at least
    assert first_burst.after["udfserve_backend_oom_total"] == first_burst.after["udfserve_oom_splits_total"]
    assert first_burst.after["udfserve_batch_limit_rows"] == FIRST_LIMIT_ROWS


def test_later_batches_run_at_the_lowered_limit_without_running_out_of_memory(
    first_burst: FirstBurst, oom_server: ServerProcess
) -> None:
    x = features(MAX_BATCH_SIZE, 99)
    answer = stream_predict(oom_server.grpc_target(), [request(MODEL_NAME, batch_of({"features": x}))])[0]
    assert answer.code == grpc.StatusCode.OK, answer.message
    assert answer.outputs is not None
    np.testing.assert_allclose(
        answer.outputs.column("doubled_sum").to_numpy(), expected(x), rtol=1e-5, atol=1e-5
    )
    later = oom_metrics(oom_server)
    assert later["udfserve_oom_splits_total"] == first_burst.after["udfserve_oom_splits_total"]


def test_a_row_too_big_to_fit_alone_fails_only_its_request_naming_model_and_row(
    first_burst: FirstBurst, oom_server: ServerProcess
) -> None:
    huge = features(5, 7)
    huge[2, 0] = HUGE_ROW_MARKER
    neighbours = {1: features(4, 1), 3: features(6, 3)}
    answers = stream_predict(
        oom_server.grpc_target(),
        [
            request(MODEL_NAME, batch_of({"features": neighbours[1]}), 1),
            request(MODEL_NAME, batch_of({"features": huge}), 2),
            request(MODEL_NAME, batch_of({"features": neighbours[3]}), 3),
        ],
    )
    assert answers[2].code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"model '{MODEL_NAME}'" in answers[2].message
    assert "row 2 of the request's 5 rows" in answers[2].message
    assert "OOM when allocating tensor" in answers[2].message
    for batch_id, x in neighbours.items():
        assert answers[batch_id].code == grpc.StatusCode.OK, answers[batch_id].message
        got = answers[batch_id].outputs.column("doubled_sum").to_numpy()  # type: ignore[union-attr]
        np.testing.assert_allclose(got, expected(x), rtol=1e-5, atol=1e-5)
    assert oom_metrics(oom_server)["udfserve_batch_limit_rows"] == FIRST_LIMIT_ROWS
