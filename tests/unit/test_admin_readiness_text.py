"""What the open health endpoint may say of files: names relative to the repository, no server paths."""

from __future__ import annotations

from pathlib import Path

from udfserve.services.model_server.frontends.http_api import without_server_paths


def test_paths_inside_the_repository_become_relative_to_it(tmp_path: Path) -> None:
    text = (
        f"model 'broken': loading {tmp_path}/broken/1 failed: "
        f"cannot read {tmp_path.resolve()}/broken/1/model.keras"
    )
    assert without_server_paths(text, tmp_path) == (
        "model 'broken': loading broken/1 failed: cannot read broken/1/model.keras"
    )


def test_other_absolute_paths_keep_only_their_last_name(tmp_path: Path) -> None:
    text = 'File "/opt/venv/lib/python3.11/site-packages/keras/src/saving/saving_api.py", line 3'
    assert without_server_paths(text, tmp_path) == 'File "saving_api.py", line 3'


def test_the_repository_itself_is_named_as_the_current_folder(tmp_path: Path) -> None:
    assert without_server_paths(f"no model folder in {tmp_path}", tmp_path) == "no model folder in ."
