"""The HTTP admin app cannot take the serving loop's turns: it answers from a thread of its own,
paces its renders of /metrics, and answers clients over their rate 429."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_harness import metric_value, module_server

from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.core.model_table import ModelTable
from udfserve.services.model_server.frontends.admin_server import (
    SERVING_LOOP_TIMEOUT_S,
    AdminThread,
    ServingLoop,
)
from udfserve.services.model_server.frontends.http_api import create_admin_app
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.services.model_server.observability.metrics import ServerMetrics

RENDER_INTERVAL_S = 10.0
"""--metrics-min-interval-s of the pacing server: scrapes sent at once all arrive within it."""

paced_server = module_server(
    "admin-paced",
    ["--metrics-min-interval-s", str(RENDER_INTERVAL_S), "--models", "tabular_mlp"],
    repository="tabular_onnx_repository",
    http_port=0,
)
limited_server = module_server(
    "admin-limited",
    ["--admin-requests-per-s", "0.001", "--models", "tabular_mlp"],
    repository="tabular_onnx_repository",
    http_port=0,
)


def http_get(address: str, path: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=60) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def with_serving_loop_blocked_while(ask: str, tmp_path: Path) -> tuple[int, dict[str, str], bytes]:
    """Run the admin app of a server (an empty repository) beside a serving loop that stays blocked
    until a GET of ``ask`` from another thread was answered (or a minute passed); the answer."""
    config = ServerConfig(model_repository=tmp_path, socket=tmp_path / "unused.sock", port=None)
    metrics = ServerMetrics(config.device)
    answered = threading.Event()
    answer: list[tuple[int, dict[str, str], bytes]] = []

    async def serving_loop() -> None:
        app = create_admin_app(
            ModelTable(config, metrics), metrics, config.device, ServingLoop(asyncio.get_running_loop())
        )
        http_socket = socket.create_server(("127.0.0.1", 0))
        address = f"127.0.0.1:{http_socket.getsockname()[1]}"
        admin = AdminThread(app, http_socket, {})
        admin.start()

        def ask_admin() -> None:
            answer.append(http_get(address, ask))
            answered.set()

        threading.Thread(target=ask_admin, daemon=True).start()
        answered.wait(timeout=60)  # blocks the serving loop: nothing else of it runs meanwhile
        await admin.stop()

    asyncio.run(serving_loop())
    assert answer, f"GET {ask} was not answered while the serving loop was blocked"
    return answer[0]


def test_metrics_are_answered_while_the_serving_loop_is_blocked(tmp_path: Path) -> None:
    status, _, body = with_serving_loop_blocked_while("/metrics", tmp_path)
    assert status == 200 and b"udfserve_server_info" in body


def test_liveness_fails_while_the_serving_loop_is_blocked(tmp_path: Path) -> None:
    status, _, body = with_serving_loop_blocked_while("/health/live", tmp_path)
    assert status == 503
    assert f"did not answer within {SERVING_LOOP_TIMEOUT_S:g} s" in json.loads(body)["detail"]


def renders(page: bytes) -> float:
    return metric_value(page.decode(), "udfserve_metrics_renders_total")


def test_scrapes_that_arrive_together_share_one_render(paced_server: ServerProcess) -> None:
    address = paced_server.http_address or ""
    _, _, first = http_get(address, "/metrics")
    with ThreadPoolExecutor(4) as pool:
        pages = list(pool.map(lambda _: http_get(address, "/metrics")[2], range(4)))
    assert {renders(page) for page in pages} == {renders(first) + 1}


def test_a_client_over_its_admin_rate_is_answered_429_with_the_reason(limited_server: ServerProcess) -> None:
    address = limited_server.http_address or ""
    answers = [http_get(address, "/health/live") for _ in range(2)]
    assert answers[0][0] == 200
    status, headers, body = answers[1]
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert "at most 0.001 a second" in json.loads(body)["detail"]


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_the_openapi_document_and_pages_are_off_by_default(paced_server: ServerProcess, path: str) -> None:
    status, _, _ = http_get(paced_server.http_address or "", path)
    assert status == 404
