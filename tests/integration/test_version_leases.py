"""Versions kept for the jobs that pinned them: leased, renewed, lapsed, bounded, loaded on demand.

A real server polls a copy of ``tabular_mlp`` (version 1) with a short lease. Requests naming a
version are what a Spark job with ``version_consistency="job"`` sends; requests naming none are
what a new job's driver asks first. Versions are published the documented way (a hidden folder,
renamed). Waits are on the server's own state (its repository index), never on a fixed time.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.integration.model_control_client import index_states
from tests.integration.server_harness import batch_of, request, running_server
from tests.node.node_harness import wait_until
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess

MODEL = "tabular_mlp"
LEASE_S = 3.0
POLL = ["--model-control", "poll", "--repository-poll-s", "0.2", "--repository-settle-s", "0.5"]
FEATURES = np.random.default_rng(11).normal(size=(16, 64)).astype(np.float32)
WAIT_S = 120.0


@pytest.fixture
def repository(tabular_repository: Path) -> Path:
    return tabular_repository


def leasing_server(
    repository: Path, socket_dir: Path, factory: pytest.TempPathFactory, *flags: str, lease_s: float = LEASE_S
) -> AbstractContextManager[ServerProcess]:
    lease = ["--version-lease-s", str(lease_s)]
    return running_server(repository, socket_dir, factory, "leases", [*POLL, *lease, *flags])


@pytest.fixture
def server(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with leasing_server(repository, socket_dir, tmp_path_factory) as started:
        yield started


@pytest.fixture
def bounded_server(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Leases longer than the test: what it sees depends on the bound, not on how long it took."""
    bound = ("--max-leased-versions", "1")
    with leasing_server(repository, socket_dir, tmp_path_factory, *bound, lease_s=3600) as started:
        yield started


def publish(source: Path, repository: Path, version: int) -> None:
    staging = repository / MODEL / f".{version}.incoming"
    shutil.copytree(source, staging)
    staging.rename(repository / MODEL / str(version))


def answer(server: ServerProcess, version: int = 0) -> tuple[grpc.StatusCode, int, str]:
    """The status of one request naming ``version`` (0: none), the version that computed it, and
    the refusal's message."""
    with grpc.insecure_channel(f"unix://{server.unix_socket}") as channel:
        [response] = list(
            pb_grpc.InferenceStub(channel).Predict(
                iter([request(MODEL, batch_of({"features": FEATURES}), version=version)]), timeout=60
            )
        )
    if response.HasField("error"):
        code = next(c for c in grpc.StatusCode if c.value[0] == response.error.code)
        return code, 0, response.error.message
    return grpc.StatusCode.OK, response.model_version, ""


def states(server: ServerProcess) -> dict[int, str]:
    with grpc.insecure_channel(f"unix://{server.unix_socket}") as channel:
        return index_states(pb_grpc.InferenceStub(channel), MODEL)


def wait_for_states(server: ServerProcess, expected: dict[int, str], what: str) -> None:
    wait_until(lambda: states(server) == expected or None, WAIT_S, what)


def test_a_replaced_version_keeps_answering_the_requests_that_name_it(
    server: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    publish(tabular_onnx_version_2, repository, 2)
    wait_until(lambda: answer(server)[1] == 2 or None, WAIT_S, "version 2 answering requests naming none")

    assert answer(server, version=1)[:2] == (grpc.StatusCode.OK, 1)
    assert answer(server)[:2] == (grpc.StatusCode.OK, 2)


def test_a_lease_renewed_by_requests_outlives_its_length_and_lapses_after_the_last(
    server: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    publish(tabular_onnx_version_2, repository, 2)
    wait_for_states(server, {1: "READY", 2: "READY"}, "version 1 leased beside version 2")

    renewing_until = time.monotonic() + 2 * LEASE_S
    answered = []
    while time.monotonic() < renewing_until:  # requests naming version 1 for two leases' length
        answered.append(answer(server, version=1)[:2])
    assert set(answered) == {(grpc.StatusCode.OK, 1)}
    last_request = time.monotonic()

    wait_for_states(server, {2: "READY"}, "version 1 unloaded once no request names it")
    assert time.monotonic() - last_request >= LEASE_S


def test_past_the_bound_a_replaced_version_is_unloaded_and_a_request_naming_it_is_told_why(
    bounded_server: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    publish(tabular_onnx_version_2, repository, 2)
    wait_for_states(bounded_server, {1: "READY", 2: "READY"}, "version 1 leased beside version 2")
    publish(tabular_onnx_version_2, repository, 3)
    wait_for_states(bounded_server, {1: "READY", 3: "READY"}, "version 3 serving, version 2 not kept")

    code, _, message = answer(bounded_server, version=2)

    assert code is grpc.StatusCode.NOT_FOUND
    assert "version 2 is no longer served" in message and "--max-leased-versions 1" in message
    assert answer(bounded_server, version=1)[:2] == (grpc.StatusCode.OK, 1)


def test_a_version_of_the_repository_a_request_names_is_loaded_for_it_leased(
    repository: Path, tabular_onnx_version_2: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A server started after a newer version was published, asked for the job's older one."""
    publish(tabular_onnx_version_2, repository, 2)
    with leasing_server(repository, socket_dir, tmp_path_factory) as server:
        assert states(server) == {2: "READY"}

        code, _, message = answer(server, version=1)

        assert code is grpc.StatusCode.UNAVAILABLE and "loading for the job that names it" in message
        wait_until(lambda: answer(server, version=1)[1] == 1 or None, WAIT_S, "version 1 loaded, leased")
        assert answer(server)[1] == 2
