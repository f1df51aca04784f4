"""A server asked to cut large calls into one part per core answers exactly what the model computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from server_harness import keras_reference, metric_value, module_server, scrape
from test_predictions import MAX_BATCH, example_inputs, predict_over

from udfserve.services.model_server.launcher import ServerProcess

cutting_server = module_server("cut", ["--cpu-parallel-min-rows", "64"], port=0, http_port=0)


@pytest.mark.parametrize("model", sorted(MAX_BATCH))
@pytest.mark.parametrize("rows", [127, 128, 1000, 5001])
def test_cut_calls_answer_every_row_as_the_model_computes_it(
    cutting_server: ServerProcess, example_repository: Path, model: str, rows: int
) -> None:
    inputs = example_inputs(model, rows, seed=rows)
    got = predict_over(f"unix://{cutting_server.unix_socket}", model, inputs)
    for name, values in keras_reference(example_repository, model, inputs).items():
        assert got[name].shape == values.shape
        np.testing.assert_allclose(got[name], values, atol=1e-5, rtol=1e-5)


def test_the_server_counts_each_cut_call_once(cutting_server: ServerProcess) -> None:
    """The parts are one backend call to the batcher and the metrics: rows are not counted twice."""
    address = cutting_server.http_address or ""
    before = metric_value(scrape(address), "udfserve_batch_size_rows_sum", model="tabular_mlp")
    predict_over(f"unix://{cutting_server.unix_socket}", "tabular_mlp", example_inputs("tabular_mlp", 1000))
    after = metric_value(scrape(address), "udfserve_batch_size_rows_sum", model="tabular_mlp")

    assert after - before == 1000
