"""``--help`` of ``udfserve serve`` and ``udfserve node`` lists each setting under its group, read
from one mapping (``settings_groups``) that names a group for every setting."""

from __future__ import annotations

import argparse

import pytest
from pydantic_settings import BaseSettings

from udfserve.services.cli import build_parser
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.node.config import NodeConfig
from udfserve.services.settings_cli import add_settings_arguments, flag_name
from udfserve.services.settings_groups import GROUPS, SETTING_GROUPS, group_of

COMMANDS: dict[str, type[BaseSettings]] = {"serve": ServerConfig, "node": NodeConfig}


@pytest.mark.parametrize("settings_cls", COMMANDS.values(), ids=COMMANDS.keys())
def test_every_setting_has_a_help_group(settings_cls: type[BaseSettings]) -> None:
    missing = [name for name in settings_cls.model_fields if name not in SETTING_GROUPS]
    assert missing == [], f"settings without a group in SETTING_GROUPS: {missing}"


def test_every_group_named_for_a_setting_is_a_listed_group() -> None:
    unlisted = {name: group for name, group in SETTING_GROUPS.items() if group not in GROUPS}
    assert unlisted == {}


def test_the_mapping_names_no_setting_that_no_command_has() -> None:
    known = set(ServerConfig.model_fields) | set(NodeConfig.model_fields)
    assert sorted(set(SETTING_GROUPS) - known) == []


def test_the_issues_groups_are_all_listed_first_in_their_order() -> None:
    expected = ["listening", "security", "limits", "models", "batching", "observability"]
    assert list(GROUPS)[: len(expected)] == expected


def test_a_setting_with_no_group_is_refused_naming_the_mapping() -> None:
    with pytest.raises(TypeError) as refused:
        group_of("frobnicate_s")
    assert "setting 'frobnicate_s' has no --help group" in str(refused.value)
    assert "SETTING_GROUPS" in str(refused.value)


def help_sections(command: str) -> dict[str, str]:
    """Each section of a command's ``--help``, by title: the text up to the next title."""
    subparsers = next(
        action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)
    )
    text = subparsers.choices[command].format_help()
    sections: dict[str, str] = {}
    title = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            sections[title] = ""
        elif title:
            sections[title] += line + "\n"
    return sections


@pytest.mark.parametrize("command", COMMANDS)
def test_each_flag_is_listed_under_its_group_in_help(command: str) -> None:
    sections = help_sections(command)
    for name in COMMANDS[command].model_fields:
        section = sections[group_of(name)]
        flag = flag_name(name)
        assert f"  {flag} " in section or f"  {flag}\n" in section or f"  {flag}," in section, (
            f"{flag} not under {group_of(name)!r} in `udfserve {command} --help`"
        )


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_the_groups_in_their_order_with_their_descriptions(command: str) -> None:
    sections = help_sections(command)
    used = [group for group in GROUPS if group in {group_of(name) for name in COMMANDS[command].model_fields}]
    assert [title for title in sections if title in GROUPS] == used
    for group in used:
        assert " ".join(sections[group].split()).startswith(" ".join(GROUPS[group].split()))


@pytest.mark.parametrize("command", COMMANDS)
def test_config_is_listed_with_the_general_options(command: str) -> None:
    assert "--config FILE" in help_sections(command)["options"]


def test_flags_of_a_parser_not_grouped_stay_in_one_list() -> None:
    parser = argparse.ArgumentParser(prog="udfserve serve")
    add_settings_arguments(parser, ServerConfig)
    assert "\nlistening:" not in parser.format_help()
