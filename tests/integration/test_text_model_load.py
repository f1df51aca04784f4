"""A text model's tokenizer is part of the model: a server serves the model behind it, refuses a
version whose tokenizer file is broken naming the file, and reports a text model whose tokenizers
package is missing with the extra that installs it, serving its other models either way.

The missing package is made unimportable in the server's process by a ``sitecustomize`` module
(as ``test_backend_not_installed.py`` does for onnxruntime): ``sys.modules["tokenizers"] = None``
is what a process without the package sees.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from server_harness import http_json, request, running_server, stream_predict

from udfserve.services.examples.text_classifier import MAX_LENGTH, write_fine_tuned_folder
from udfserve.services.hf_import import import_hugging_face
from udfserve.services.model_server.launcher import ServerProcess

BLOCKER = '''"""Makes tokenizers unimportable here, as where the text extra is not installed."""
import sys

sys.modules["tokenizers"] = None
'''


@pytest.fixture(scope="module")
def text_repository(tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``reviews`` (imported to ONNX), ``broken_tokenizer`` (the same with its tokenizer.json cut
    in half) and ``tabular_mlp``, a model without a tokenizer."""
    root = tmp_path_factory.mktemp("text_models")
    fine_tuned = write_fine_tuned_folder(tmp_path_factory.mktemp("hf") / "fine_tuned")
    import_hugging_face(fine_tuned, root, "reviews", max_length=MAX_LENGTH)
    shutil.copytree(root / "reviews", root / "broken_tokenizer")
    broken = root / "broken_tokenizer" / "1" / "tokenizer.json"
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    config = root / "broken_tokenizer" / "config.yaml"
    config.write_text(config.read_text().replace("name: reviews", "name: broken_tokenizer"))
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", root / "tabular_mlp")
    return root


@pytest.fixture(scope="module")
def text_server(
    text_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(text_repository, socket_dir, tmp_path_factory, "text", http_port=0) as process:
        yield process


@pytest.fixture(scope="module")
def server_without_tokenizers(
    text_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    blocker_dir = tmp_path_factory.mktemp("no_tokenizers")
    (blocker_dir / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(blocker_dir), os.environ.get("PYTHONPATH", "")]))
    with running_server(
        text_repository,
        socket_dir,
        tmp_path_factory,
        "no-tokenizers",
        http_port=0,
        env={**os.environ, "PYTHONPATH": path},
    ) as process:
        yield process


def texts_batch(*texts: str) -> pa.RecordBatch:
    return pa.record_batch({"text": pa.array(list(texts), pa.string())})


def test_a_text_model_advertises_one_string_input_and_answers_probabilities(
    text_server: ServerProcess,
) -> None:
    status, info = http_json(text_server.http_address or "", "/v1/models/reviews")
    answers = stream_predict(
        text_server.grpc_target(), [request("reviews", texts_batch("the movie was great", "", "dull " * 500))]
    )

    assert status == 200 and isinstance(info, dict)
    assert [(tensor["name"], tensor["dtype"], tensor["shape"]) for tensor in info["inputs"]] == [
        ("text", "string", [])
    ]
    answer = answers[0]
    assert answer.outputs is not None, answer.message
    probabilities = np.array(answer.outputs.column("probabilities").to_pylist())
    assert probabilities.shape == (3, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)


def test_a_version_whose_tokenizer_file_is_broken_fails_its_load_naming_the_file(
    text_server: ServerProcess, text_repository: Path
) -> None:
    status, info = http_json(text_server.http_address or "", "/v1/models/broken_tokenizer")

    assert status == 200 and isinstance(info, dict)
    assert info["served_versions"] == []
    # named from the repository down: a client reads no path of the server's
    assert "cannot read the tokenizer broken_tokenizer/1/tokenizer.json" in info["error"]
    assert str(text_repository) not in info["error"]


def test_a_batch_of_numbers_for_the_text_input_is_invalid_argument_naming_it(
    text_server: ServerProcess,
) -> None:
    answers = stream_predict(
        text_server.grpc_target(), [request("reviews", pa.record_batch({"text": pa.array([1, 2, 3])}))]
    )

    assert answers[0].code.name == "INVALID_ARGUMENT"
    assert "'text'" in answers[0].message and "string" in answers[0].message


def test_without_the_tokenizers_package_the_text_model_is_reported_with_the_extra_and_the_others_serve(
    server_without_tokenizers: ServerProcess,
) -> None:
    status, readiness = http_json(server_without_tokenizers.http_address or "", "/health/ready")
    answers = stream_predict(
        server_without_tokenizers.grpc_target(),
        [
            request(
                "tabular_mlp",
                pa.record_batch(
                    {"features": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(64, np.float32)), 64)}
                ),
            )
        ],
    )

    assert status == 200 and isinstance(readiness, dict) and readiness["ready"] is True
    assert "needs the tokenizers package" in readiness["failed"]["reviews"]
    assert "pip install 'udfserve[text]'" in readiness["failed"]["reviews"]
    assert answers[0].outputs is not None, answers[0].message
