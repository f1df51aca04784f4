"""Several client processes at once: each gets exactly its own rows, each model is loaded once."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from server_harness import (
    client_inputs,
    client_process_main,
    keras_reference,
    metric_value,
    module_server,
    scrape,
)

from udfserve.services.model_server.launcher import ServerProcess

CLIENTS = 4
BATCHES_PER_CLIENT = 12
ROWS = 50

own_server = module_server("concurrent", port=0, http_port=0)
"""A server of this module's own, not the shared one: its tests read the server's counters whole
(one load per model since the start, fewer backend calls than requests), which other modules'
requests would move."""


@pytest.fixture(scope="module")
def concurrent_run(own_server: ServerProcess) -> dict[int, dict[int, np.ndarray]]:
    """Outputs of CLIENTS separate processes streaming at the same time, by client seed."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=CLIENTS, mp_context=context) as pool:
        futures = {
            seed: pool.submit(
                client_process_main, own_server.grpc_target(), "tabular_mlp", seed, BATCHES_PER_CLIENT, ROWS
            )
            for seed in range(100, 100 + CLIENTS)
        }
        return {seed: future.result(timeout=300) for seed, future in futures.items()}


@pytest.mark.slow
def test_each_client_process_gets_exactly_its_own_rows_back(
    concurrent_run: dict[int, dict[int, np.ndarray]], example_repository: Path
) -> None:
    for seed, outputs in concurrent_run.items():
        inputs = client_inputs(seed, BATCHES_PER_CLIENT, ROWS)
        assert sorted(outputs) == sorted(inputs)
        for batch_id, x in inputs.items():
            expected = keras_reference(example_repository, "tabular_mlp", {"features": x})["probabilities"]
            np.testing.assert_allclose(outputs[batch_id], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_concurrent_clients_cause_exactly_one_load_per_model(
    concurrent_run: dict[int, dict[int, np.ndarray]], own_server: ServerProcess
) -> None:
    assert concurrent_run  # the clients ran against this very server process
    metrics = scrape(own_server.http_address or "")
    for model in ("tabular_mlp", "sequence_bilstm", "multi_io", "tabular_mlp_savedmodel"):
        assert metric_value(metrics, "udfserve_model_loads_total", model=model) == 1.0
    assert (
        metric_value(metrics, "udfserve_rows_total", model="tabular_mlp")
        >= CLIENTS * BATCHES_PER_CLIENT * ROWS
    )


@pytest.mark.slow
def test_concurrent_requests_are_merged_into_fewer_backend_calls(
    concurrent_run: dict[int, dict[int, np.ndarray]], own_server: ServerProcess
) -> None:
    assert concurrent_run
    metrics = scrape(own_server.http_address or "")
    calls = metric_value(metrics, "udfserve_batch_size_rows_count", model="tabular_mlp")
    requests = metric_value(metrics, "udfserve_requests_total", model="tabular_mlp", code="OK")
    assert 0 < calls < requests
