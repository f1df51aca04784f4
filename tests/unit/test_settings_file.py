"""``--config FILE`` of ``udfserve serve`` and ``udfserve node``: a YAML file of settings, below a
flag and the environment, above the default; every refusal names the file and what was wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from udfserve.services.cli import build_parser
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.node.config import NodeConfig
from udfserve.services.settings_cli import SettingsError, settings_from_args


@pytest.fixture(autouse=True)
def no_udfserve_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of the test run must not decide what the file's settings are worth."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("UDFSERVE_"):
            monkeypatch.delenv(name)


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "udfserve.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def serve_config(*argv: str) -> ServerConfig:
    return settings_from_args(ServerConfig, build_parser().parse_args(["serve", *argv]))


def node_config(*argv: str) -> NodeConfig:
    return settings_from_args(NodeConfig, build_parser().parse_args(["node", *argv]))


def test_the_files_settings_apply_where_no_flag_or_variable_gives_them(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        "model_repository: /srv/models\n"
        "models: [tabular_mlp, multi_io]\n"
        "max_message_bytes: 1048576\n"
        "http_docs: true\n"
        "shared_memory_uids: [185, 1000]\n",
    )
    config = serve_config("--config", str(path))
    assert config.model_repository == Path("/srv/models")
    assert config.models == ("tabular_mlp", "multi_io")
    assert config.max_message_bytes == 1 << 20
    assert config.http_docs is True
    assert config.shared_memory_uids == (185, 1000)


def test_a_flag_wins_over_the_file(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\nport: 9100\n")
    assert serve_config("--config", str(path), "--port", "9200").port == 9200


def test_the_environment_wins_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UDFSERVE_PORT", "9300")
    path = config_file(tmp_path, "model_repository: /srv/models\nport: 9100\n")
    assert serve_config("--config", str(path)).port == 9300


def test_a_flag_wins_over_the_environment_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UDFSERVE_PORT", "9300")
    path = config_file(tmp_path, "model_repository: /srv/models\nport: 9100\n")
    assert serve_config("--config", str(path), "--port", "9200").port == 9200


def test_a_setting_the_file_leaves_out_keeps_its_default(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\n")
    assert (
        serve_config("--config", str(path)).max_message_bytes
        == ServerConfig.model_fields["max_message_bytes"].get_default()
    )


def test_off_in_the_file_turns_a_listener_off_as_on_the_command_line(tmp_path: Path) -> None:
    # YAML 1.1 would read off as false, and false as port 0: a free port instead of none.
    path = config_file(tmp_path, "model_repository: /srv/models\nsocket: /tmp/s.sock\nport: off\n")
    assert serve_config("--config", str(path)).port is None


def test_a_boolean_setting_takes_yaml_true_and_false(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\ntrust_savedmodels: false\n")
    assert serve_config("--config", str(path)).trust_savedmodels is False


def test_an_empty_file_gives_no_setting(tmp_path: Path) -> None:
    path = config_file(tmp_path, "# nothing set here\n")
    assert serve_config("--config", str(path), "--model-repository", "/m").port == 7500


def test_an_unknown_key_is_refused_naming_it_the_file_and_the_known_settings(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\nbatch_timeout: 3\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path))
    message = str(refused.value)
    assert f"--config {path}" in message
    assert "'batch_timeout' is not a setting of `udfserve serve`" in message
    assert "the settings of `udfserve serve` are: model_control," in message
    assert "max_message_bytes" in message


def test_a_key_written_as_a_flag_is_refused_with_its_snake_case_name(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model-repository: /srv/models\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path))
    assert "'model-repository' is not a setting" in str(refused.value)
    assert "did you mean 'model_repository'?" in str(refused.value)


def test_a_misspelt_key_is_refused_with_the_closest_setting(tmp_path: Path) -> None:
    path = config_file(tmp_path, "inference_thread: 2\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path), "--model-repository", "/m")
    assert "did you mean 'inference_threads'?" in str(refused.value)


def test_a_value_of_the_wrong_type_names_the_file_the_key_and_the_value(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\nmax_message_bytes: lots\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path))
    message = str(refused.value)
    assert f"--config {path}, key max_message_bytes: Input should be a valid integer" in message
    assert "(received 'lots')" in message


def test_a_value_out_of_bounds_in_the_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\nmax_message_bytes: 1\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path))
    assert f"--config {path}, key max_message_bytes: Input should be greater than or equal to 65536" in str(
        refused.value
    )


def test_a_token_in_the_file_is_never_echoed_in_an_error(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\nauth_token: '   '\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path))
    assert f"--config {path}, key auth_token" in str(refused.value)
    assert "(received (hidden))" in str(refused.value)


def test_a_wrong_value_given_by_a_flag_over_the_file_names_the_flag(tmp_path: Path) -> None:
    path = config_file(tmp_path, "model_repository: /srv/models\nport: 9100\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path), "--port", "eighty")
    assert "--port / UDFSERVE_PORT" in str(refused.value) and "--config" not in str(refused.value)


def test_a_missing_file_is_refused_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(tmp_path / "absent.yaml"), "--model-repository", "/m")
    assert f"cannot read --config {tmp_path / 'absent.yaml'}: No such file or directory" in str(refused.value)


def test_a_file_that_is_not_yaml_is_refused_with_its_path(tmp_path: Path) -> None:
    path = config_file(tmp_path, "port: [9100\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path), "--model-repository", "/m")
    assert f"--config {path} is not valid YAML" in str(refused.value)


def test_a_file_that_is_not_a_mapping_is_refused_saying_what_is_expected(tmp_path: Path) -> None:
    path = config_file(tmp_path, "- port\n- 9100\n")
    with pytest.raises(SettingsError) as refused:
        serve_config("--config", str(path), "--model-repository", "/m")
    assert f"--config {path} holds a YAML list; expected a mapping of setting names to values" in str(
        refused.value
    )


def test_the_node_reads_its_own_settings_from_the_file(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    path = config_file(
        tmp_path,
        f"model_repository: {repository}\n"
        "devices: sim:0,sim:1\n"
        "model_control: poll\n"
        "server_args: --inference-threads 2\n",
    )
    config = node_config("--config", str(path))
    assert config.devices == "sim:0,sim:1"
    assert config.model_control == "poll"
    assert config.server_extra_args == ["--inference-threads", "2"]


def test_the_nodes_shared_settings_from_the_file_reach_its_servers_as_flags(tmp_path: Path) -> None:
    from udfserve.services.node.devices import DeviceSlot

    repository = tmp_path / "models"
    repository.mkdir()
    path = config_file(tmp_path, f"model_repository: {repository}\nversion_drain_s: 7.5\n")
    flags = node_config("--config", str(path)).server_flags(DeviceSlot(device="cpu"))
    assert flags[flags.index("--version-drain-s") + 1] == "7.5"


def test_a_server_setting_in_the_nodes_file_is_refused_as_not_the_nodes(tmp_path: Path) -> None:
    path = config_file(tmp_path, f"model_repository: {tmp_path}\ninference_threads: 2\n")
    with pytest.raises(SettingsError) as refused:
        node_config("--config", str(path))
    assert "'inference_threads' is not a setting of `udfserve node`" in str(refused.value)
    assert "it is a setting of each server; expected it in server_args (server_args: --inference-threads" in (
        str(refused.value)
    )


def test_a_server_setting_the_node_sets_itself_is_refused_naming_the_nodes_own(tmp_path: Path) -> None:
    path = config_file(tmp_path, f"model_repository: {tmp_path}\nport: 9100\n")
    with pytest.raises(SettingsError) as refused:
        node_config("--config", str(path))
    expected = (
        "'port' is not a setting of `udfserve node`: the node sets it on every server itself, from the "
        "node's --server-port-base"
    )
    assert expected in str(refused.value)
