"""The HTTP admin app of a real server, fuzzed: every endpoint of its own OpenAPI document with
generated valid and malformed input (schemathesis), with and without the token, and every path
parameter with hand-picked hostile text (very long, unicode, traversal, percent-encoded, control
bytes). Never a 5xx; every error is JSON with a ``detail``.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case

from udfserve.services.model_server.launcher import ServerProcess, launch_server

TOKEN = "fuzz-token-7f3a"
AUTHORIZED = {"authorization": f"Bearer {TOKEN}"}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
TEXT_ENDPOINTS = {"/metrics"}  # Prometheus exposition: text by contract


@pytest.fixture(scope="module")
def token_server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("admin-fuzz")
    process = launch_server(
        example_repository,
        socket=socket_dir / "fuzz.sock",
        extra_args=[
            "--auth-token",
            TOKEN,
            "--models",
            "tabular_mlp,multi_io",
            "--http-docs",
            # the fuzzing asks far more often than a scraper; its answers are the subject here
            "--admin-requests-per-s",
            "100000",
            "--admin-total-requests-per-s",
            "100000",
        ],
        log_path=logs / "server.log",
    )
    yield process
    assert process.terminate() == 0


@pytest.fixture(scope="module")
def admin_schema(token_server: ServerProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(
        f"http://{token_server.http_address}/openapi.json", headers=AUTHORIZED
    )


def assert_answered_properly(path: str, status: int, content_type: str, body: bytes) -> None:
    assert status < 500, f"{path} answered {status}: {body[:300]!r}"
    if path in TEXT_ENDPOINTS and status == 200:
        return
    assert content_type.startswith("application/json"), f"{path} answered {status} as {content_type}"
    document = json.loads(body)
    if status >= 400:
        assert isinstance(document, dict) and "detail" in document, f"{path} answered {status}: {document}"


@pytest.mark.parametrize("authorization", ["token", "generated"])
def test_every_endpoint_never_fails_and_answers_json(
    admin_schema: schemathesis.BaseSchema, authorization: str
) -> None:
    """Cases generated from the OpenAPI document: arbitrary text for the model name and for the
    authorization header, with the token or with whatever header was generated. (Schemathesis's
    negative mode has nothing to break here: every parameter is free text.)"""
    operations = {result.ok().label for result in admin_schema.get_all_operations()}
    tried: set[str] = set()

    @FUZZ
    @given(case=admin_schema.as_strategy())
    def call(case: Case) -> None:
        tried.add(case.operation.label)
        response = case.call(headers=AUTHORIZED if authorization == "token" else None)
        content_type = response.headers.get("content-type", [""])[0]
        assert_answered_properly(case.path, response.status_code, content_type, response.content)

    call()
    assert tried == operations


HOSTILE_NAMES = [
    "a" * 4000,
    "模型",
    "mödel",
    "\u202etabular_mlp",
    "..",
    "../tabular_mlp",
    "..%2f..%2fetc%2fpasswd",
    "%2e%2e",
    "%252e%252e%252f",
    "tabular_mlp%00",
    "tabular_mlp\x00.keras",
    "/etc/passwd",
    "C:\\Windows",
    "${jndi:ldap://x}",
    "'; DROP TABLE models; --",
    "tabular_mlp/../multi_io",
    " ",
    "\t\n",
    "%",
    "%zz",
]


def raw_request(address: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """A request with the path sent exactly as given (no client-side normalisation)."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for key, value in headers.items():
            connection.putheader(key, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.getheader("content-type", ""), response.read()
    finally:
        connection.close()


def raw_get(address: str, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    return raw_request(address, "GET", path, headers)


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
@pytest.mark.parametrize("encoding", ["percent-encoded", "as is"])
def test_hostile_model_names_in_the_path_are_refused_with_json(
    token_server: ServerProcess, name: str, encoding: str
) -> None:
    text = quote(name, safe="") if encoding == "percent-encoded" else quote(name, safe="/%.:'$;{}\\")
    path = f"/v1/models/{text}"
    status, content_type, body = raw_get(token_server.http_address or "", path, AUTHORIZED)
    assert_answered_properly(path, status, content_type, body)
    assert status in (400, 404, 422), f"{path} answered {status}: {body[:200]!r}"


def test_a_request_without_the_token_is_refused_with_json(token_server: ServerProcess) -> None:
    status, content_type, body = raw_get(token_server.http_address or "", "/v1/models/tabular_mlp", {})
    assert status == 401
    assert_answered_properly("/v1/models/tabular_mlp", status, content_type, body)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_methods_the_app_does_not_offer_are_refused_with_json(
    token_server: ServerProcess, admin_schema: schemathesis.BaseSchema, method: str
) -> None:
    offered = {(result.ok().method.upper(), result.ok().path) for result in admin_schema.get_all_operations()}
    for path in sorted({path for _, path in offered}):
        if (method, path) in offered:
            continue
        concrete = path.replace("{name}", "tabular_mlp")
        status, content_type, body = raw_request(
            token_server.http_address or "", method, concrete, AUTHORIZED
        )
        assert status == 405, f"{method} {concrete} answered {status}"
        assert_answered_properly(concrete, status, content_type, body)


def test_bytes_that_are_not_http_are_refused_and_the_app_keeps_serving(token_server: ServerProcess) -> None:
    """Refused by uvicorn before the app sees them (its answer is plain text, not the app's JSON)."""
    host, port = (token_server.http_address or "").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(b"\x00\xff\xfe not http at all\r\n\r\n")
        answer = connection.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 ")
    status, content_type, body = raw_get(token_server.http_address or "", "/health/live", {})
    assert status == 200
    assert_answered_properly("/health/live", status, content_type, body)
