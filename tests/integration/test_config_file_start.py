"""A real ``udfserve serve --config FILE`` start: the file's settings apply, and a variable of the
environment wins over the file's value for the same setting."""

from __future__ import annotations

import os
from pathlib import Path

from server_harness import http_json

from udfserve.services.model_server.launcher import launch_server


def test_a_server_started_with_a_config_file_runs_with_its_settings_and_the_environment_wins(
    example_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models: [tabular_mlp, multi_io]  # UDFSERVE_MODELS below names one: the environment wins\n"
        "http_docs: true\n",
        encoding="utf-8",
    )
    environment = {**os.environ, "UDFSERVE_MODELS": "tabular_mlp"}
    server = launch_server(
        example_repository,
        socket=socket_dir / "config.sock",
        port=None,
        env=environment,
        extra_args=["--config", str(config)],
    )
    try:
        http = server.http_address or ""
        status, models = http_json(http, "/v1/models")
        assert status == 200
        assert isinstance(models, list)
        assert [model["name"] for model in models] == ["tabular_mlp"]
        status, document = http_json(http, "/openapi.json")  # --http-docs is off unless the file says so
        assert status == 200 and isinstance(document, dict) and "/v1/models" in document["paths"]
    finally:
        server.terminate()
