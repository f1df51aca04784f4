"""Who may have written a node file: the checks both the node and the Spark client apply.

Files and folders of "another user" belong to ``nobody`` (uid 65534), given with ``chown``: these
tests run as root, as the suite does, or are skipped. The real second user, a process running as
``nobody`` that forges the files itself, is in tests/node/test_runtime_dir_trust.py and
tests/spark/test_node_file_trust.py.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from udfserve.discovery import (
    NodeDiscovery,
    UntrustedDiscoveryFile,
    default_discovery_path,
    default_runtime_dir,
    read_discovery,
    write_discovery,
)
from udfserve.node_files import (
    SocketMissing,
    UntrustedNodeFile,
    check_folder,
    check_node_socket,
    read_node_file,
    trusted_uids,
)

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user (chown) needs root")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A private folder of this user, as the node makes its runtime folder."""
    path = tmp_path / "rt"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def node_file(folder: Path) -> Path:
    path = folder / "discovery.json"
    write_discovery(path, NodeDiscovery(node="n1"))
    return path


@pytest.fixture
def listening_socket(folder: Path) -> Iterator[Path]:
    path = folder / "server.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        yield path


def test_a_file_of_this_user_in_a_private_folder_is_read(node_file: Path) -> None:
    assert read_discovery(node_file).node == "n1"


def test_the_default_runtime_folder_is_this_user_s_own() -> None:
    assert default_runtime_dir() == Path(f"/tmp/udfserve-{os.geteuid()}")
    assert default_discovery_path({}) == Path(f"/tmp/udfserve-{os.geteuid()}/discovery.json")


def test_root_and_this_user_are_always_trusted_and_others_only_when_named() -> None:
    assert trusted_uids() == {0, os.geteuid()}
    assert trusted_uids([10001]) == {0, os.geteuid(), 10001}


@as_root
def test_a_file_of_another_user_is_refused_naming_its_owner_and_who_was_expected(node_file: Path) -> None:
    os.chown(node_file, NOBODY, NOBODY)
    with pytest.raises(
        UntrustedDiscoveryFile, match=r"belongs to uid 65534 \(nobody\), expected one of uid 0"
    ):
        read_discovery(node_file)


@as_root
def test_a_file_of_another_user_is_read_when_the_reader_trusts_that_uid(node_file: Path) -> None:
    os.chown(node_file, NOBODY, NOBODY)
    os.chown(node_file.parent, NOBODY, NOBODY)
    assert read_discovery(node_file, trusted_uids([NOBODY])).node == "n1"


@as_root
def test_a_folder_of_another_user_is_refused_though_the_file_is_this_user_s(node_file: Path) -> None:
    os.chown(node_file.parent, NOBODY, NOBODY)
    with pytest.raises(
        UntrustedDiscoveryFile, match=r"the folder of the discovery file .* belongs to uid 65534"
    ):
        read_discovery(node_file)


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o1777])
def test_a_folder_others_may_write_is_refused_even_with_the_sticky_bit(node_file: Path, mode: int) -> None:
    node_file.parent.chmod(mode)
    with pytest.raises(
        UntrustedDiscoveryFile, match=rf"has mode {mode:04o}: writable by .* who could replace"
    ):
        read_discovery(node_file)


def test_a_file_others_may_write_is_refused(node_file: Path) -> None:
    node_file.chmod(0o666)
    with pytest.raises(UntrustedDiscoveryFile, match=r"has mode 0666: writable by others"):
        read_discovery(node_file)


def test_a_folder_above_that_anyone_may_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    """Whoever can write a folder above can rename the node's folder away and put their own there."""
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)
    path = above / "rt" / "discovery.json"
    path.parent.mkdir(mode=0o700)
    write_discovery(path, NodeDiscovery())
    with pytest.raises(UntrustedDiscoveryFile, match=rf"{above}, a folder above .* has mode 0777"):
        read_discovery(path)


def test_a_folder_above_with_the_sticky_bit_is_accepted_as_tmp_is(tmp_path: Path) -> None:
    above = tmp_path / "sticky"
    above.mkdir()
    above.chmod(0o1777)
    path = above / "rt" / "discovery.json"
    path.parent.mkdir(mode=0o700)
    write_discovery(path, NodeDiscovery(node="n2"))
    assert read_discovery(path).node == "n2"


def test_a_symbolic_link_in_place_of_the_file_is_refused(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    write_discovery(target, NodeDiscovery())
    (folder / "discovery.json").symlink_to(target)
    with pytest.raises(UntrustedDiscoveryFile, match=r"is a symbolic link"):
        read_discovery(folder / "discovery.json")


@as_root
def test_a_folder_reached_through_a_link_is_judged_where_it_really_is(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chown(real, NOBODY, NOBODY)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UntrustedNodeFile, match=rf"\({real}\) belongs to uid 65534"):
        check_folder(tmp_path / "link", trusted_uids(), "the runtime folder", "fix it")


def test_a_file_larger_than_any_discovery_file_is_refused(folder: Path) -> None:
    path = folder / "discovery.json"
    path.write_bytes(b" " * (5 << 20))
    with pytest.raises(UntrustedNodeFile, match=r"larger than 4194304 bytes"):
        read_node_file(path, trusted_uids(), "the discovery file", "fix it")


def test_a_socket_of_this_user_in_a_private_folder_passes(listening_socket: Path) -> None:
    check_node_socket(listening_socket, trusted_uids(), "the socket", "fix it")


@as_root
def test_a_socket_of_another_user_is_refused(listening_socket: Path) -> None:
    os.chown(listening_socket, NOBODY, NOBODY)
    with pytest.raises(
        UntrustedNodeFile, match=r"belongs to uid 65534 \(nobody\).* a process of another user"
    ):
        check_node_socket(listening_socket, trusted_uids(), "the socket", "fix it")


def test_a_socket_missing_from_a_private_folder_is_told_apart_from_a_missing_folder(folder: Path) -> None:
    with pytest.raises(SocketMissing):
        check_node_socket(folder / "absent.sock", trusted_uids(), "the socket", "fix it")
    with pytest.raises(FileNotFoundError) as missing_folder:
        check_node_socket(folder / "no" / "absent.sock", trusted_uids(), "the socket", "fix it")
    assert not isinstance(missing_folder.value, SocketMissing)
