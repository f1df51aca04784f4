"""A server that asks for a token and mutual TLS: the client sends both, and a refused token fails.

One server: its unix socket is plaintext (local, protected by its file mode) and its TCP port
speaks mutual TLS with certificates of a test CA; both ask for the bearer token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from certificates import make_certificate, make_pki
from pyspark.sql import SparkSession
from spark_data import feature_column, feature_values, reference_outputs, stacked

from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, remote_predict
from udfserve.spark_client.common.errors import AuthenticationFailed, ServerUnavailable
from udfserve.spark_client.nodes.routing import SPARK_CONF_AUTH_TOKEN

TOKEN = "spark-client-s3cret"
ROWS = 2_000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_server(
    tabular_onnx_repository: Path, pki: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("secure")
    (folder / "token").write_text(TOKEN + "\n")
    process = launch_server(
        tabular_onnx_repository,
        socket=folder / "grpc.sock",
        port=0,
        http_port=None,
        extra_args=[
            "--models", "tabular_mlp",
            "--tls-cert-file", str(pki / "server.pem"),
            "--tls-key-file", str(pki / "server.key"),
            "--tls-client-ca-file", str(pki / "ca.pem"),
            "--auth-token-file", str(folder / "token"),
        ],
        log_path=folder / "server.log",
    )  # fmt: skip
    yield process
    process.terminate()


def predictions(spark: SparkSession, column: object) -> tuple[np.ndarray, np.ndarray]:
    result = spark.range(ROWS, numPartitions=1).select("id", column).toPandas()  # type: ignore[arg-type]
    return result["id"].to_numpy(), stacked(result.iloc[:, 1])


def expected(example_repository: Path, ids: np.ndarray) -> np.ndarray:
    inputs = {"features": feature_values(ids, (64,))}
    return reference_outputs(example_repository, "tabular_mlp", inputs)["probabilities"]


def test_the_token_from_the_spark_conf_is_sent_and_the_rows_are_served(
    spark: SparkSession, secure_server: ServerProcess, example_repository: Path
) -> None:
    spark.conf.set(SPARK_CONF_AUTH_TOKEN, TOKEN)
    try:
        column = remote_predict(
            "tabular_mlp",
            feature_column((64,)),
            config=ClientConfig(address=secure_server.grpc_target(), fallback="error"),
        )
    finally:
        spark.conf.unset(SPARK_CONF_AUTH_TOKEN)
    ids, predicted = predictions(spark, column)
    np.testing.assert_allclose(predicted, expected(example_repository, ids), atol=1e-5)


def test_a_udf_built_without_the_token_fails_in_the_driver_instead_of_falling_back(
    spark: SparkSession, secure_server: ServerProcess, example_repository: Path
) -> None:
    config = ClientConfig(address=secure_server.grpc_target(), model_repository=str(example_repository))
    with pytest.raises(AuthenticationFailed, match=r"UNAUTHENTICATED.*spark\.udfserve\.authToken"):
        remote_predict("tabular_mlp", "features", config=config)


def test_a_task_whose_token_is_refused_fails_with_unauthenticated_instead_of_falling_back(
    spark: SparkSession, secure_server: ServerProcess, example_repository: Path, tmp_path: Path
) -> None:
    """The token file is read where the call is made: right in the driver, wrong on the executor."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    config = ClientConfig(
        address=secure_server.grpc_target(),
        auth_token_file=str(token_file),
        model_repository=str(example_repository),
    )
    column = remote_predict("tabular_mlp", feature_column((64,)), config=config)
    token_file.write_text("not-the-token")
    with pytest.raises(Exception, match=r"AuthenticationFailed.*UNAUTHENTICATED") as failure:
        spark.range(100, numPartitions=1).select(column).collect()
    assert "on the CPU" not in str(failure.value)


def test_the_tls_port_serves_a_client_with_the_ca_and_a_client_certificate(
    spark: SparkSession, secure_server: ServerProcess, example_repository: Path, pki: Path
) -> None:
    config = ClientConfig(
        address=secure_server.tcp_address,
        auth_token=TOKEN,
        tls_root_certificates_file=str(pki / "ca.pem"),
        tls_client_certificate_file=str(pki / "client.pem"),
        tls_client_key_file=str(pki / "client.key"),
        fallback="error",
    )
    ids, predicted = predictions(spark, remote_predict("tabular_mlp", feature_column((64,)), config=config))
    np.testing.assert_allclose(predicted, expected(example_repository, ids), atol=1e-5)


SERVICE_NAME = "udfserve.internal"


@pytest.fixture(scope="module")
def named_server(
    tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    """A TLS server whose certificate names a service, not the address the client dials; and its CA."""
    folder = tmp_path_factory.mktemp("named")
    ca = make_certificate(folder, "ca", None)
    make_certificate(folder, "service", ca, dns_names=(SERVICE_NAME,))
    process = launch_server(
        tabular_onnx_repository,
        socket=folder / "grpc.sock",
        port=0,
        http_port=None,
        extra_args=[
            "--models", "tabular_mlp",
            "--tls-cert-file", str(folder / "service.pem"),
            "--tls-key-file", str(folder / "service.key"),
        ],
        log_path=folder / "server.log",
    )  # fmt: skip
    yield process, folder / "ca.pem"
    process.terminate()


def test_a_certificate_issued_to_another_name_is_refused_without_tls_server_name(
    spark: SparkSession, named_server: tuple[ServerProcess, Path]
) -> None:
    server, ca_file = named_server
    config = ClientConfig(
        address=server.tcp_address, tls_root_certificates_file=str(ca_file), fallback="error"
    )
    with pytest.raises(ServerUnavailable, match=r"UNAVAILABLE"):
        remote_predict("tabular_mlp", config=config)


def test_tls_server_name_checks_the_certificate_against_the_service_name(
    spark: SparkSession, named_server: tuple[ServerProcess, Path], example_repository: Path
) -> None:
    server, ca_file = named_server
    config = ClientConfig(
        address=server.tcp_address,
        tls_root_certificates_file=str(ca_file),
        tls_server_name=SERVICE_NAME,
        fallback="error",
    )
    ids, predicted = predictions(spark, remote_predict("tabular_mlp", feature_column((64,)), config=config))
    np.testing.assert_allclose(predicted, expected(example_repository, ids), atol=1e-5)
