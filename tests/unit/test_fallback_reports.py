"""The rows the Spark clients' CPU fallback answered, as reported into a node's folder and exported
by its supervisor: counted once, labelled by whose file it was, and bounded whatever is written."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from udfserve.fallback_reports import add_fallback_rows, check_reports_folder, report_path
from udfserve.node_files import UntrustedNodeFile
from udfserve.services.node import fallback_metrics
from udfserve.services.node.fallback_metrics import FallbackRows, prepare_reports_folder

APP = "local-1732780000000"
OTHER_UID = 65534


def exported(collector: FallbackRows) -> dict[tuple[str, str, str], float]:
    """Scrape the collector as Prometheus would and key its samples by (model, application, owner)."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.labels["model"], s.labels["application"], s.labels["owner"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "udfserve_client_fallback_rows"
        for s in family.samples
        if s.name == "udfserve_client_fallback_rows_total"
    }


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "fallback-reports"
    prepare_reports_folder(path, shared=True)
    return path


def write_report(folder: Path, uid: int, token: str, document: object) -> Path:
    path = folder / f"{uid}-{token}.json"
    path.write_text(json.dumps(document))
    return path


def test_the_supervisor_makes_the_folder_sticky_and_writable_by_all_when_the_node_is_shared(
    folder: Path, tmp_path: Path
) -> None:
    assert folder.stat().st_mode & 0o7777 == 0o1733
    private = tmp_path / "private-reports"
    prepare_reports_folder(private, shared=False)
    assert private.stat().st_mode & 0o7777 == 0o700


def test_a_process_adds_each_tasks_fallback_rows_to_its_one_report(folder: Path) -> None:
    tokens: dict[int, str] = {}
    path = report_path(folder, os.geteuid(), 123, tokens)
    add_fallback_rows(path, APP, "tabular_mlp", 1000)
    add_fallback_rows(path, APP, "tabular_mlp", 500)
    add_fallback_rows(path, APP, "sequence_lstm", 7)
    assert report_path(folder, os.geteuid(), 123, tokens) == path
    assert report_path(folder, os.geteuid(), 124, tokens) != path
    assert json.loads(path.read_text()) == {
        "application": APP,
        "rows": {"sequence_lstm": 7, "tabular_mlp": 1500},
    }
    assert path.stat().st_mode & 0o777 == 0o644


def test_the_supervisor_exports_each_models_rows_once_and_adds_only_what_a_report_gained(
    folder: Path,
) -> None:
    collector = FallbackRows(folder)
    path = report_path(folder, os.geteuid(), 1, {})
    add_fallback_rows(path, APP, "tabular_mlp", 1000)
    assert exported(collector) == {("tabular_mlp", APP, "node"): 1000}
    assert exported(collector) == {("tabular_mlp", APP, "node"): 1000}
    add_fallback_rows(path, APP, "tabular_mlp", 250)
    assert exported(collector) == {("tabular_mlp", APP, "node"): 1250}


def test_a_report_that_is_gone_keeps_its_rows_in_the_total(folder: Path) -> None:
    collector = FallbackRows(folder)
    path = report_path(folder, os.geteuid(), 1, {})
    add_fallback_rows(path, APP, "tabular_mlp", 300)
    exported(collector)
    path.unlink()
    assert exported(collector) == {("tabular_mlp", APP, "node"): 300}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_report_of_another_user_is_counted_under_owner_other(folder: Path) -> None:
    path = write_report(folder, OTHER_UID, "0123456789abcdef", {"application": APP, "rows": {"m": 5}})
    os.chown(path, OTHER_UID, OTHER_UID)
    assert exported(FallbackRows(folder)) == {("m", APP, "other"): 5}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_report_named_for_another_uid_than_its_owners_is_removed_uncounted(folder: Path) -> None:
    path = write_report(folder, os.geteuid(), "0123456789abcdef", {"application": APP, "rows": {"m": 5}})
    os.chown(path, OTHER_UID, OTHER_UID)  # another user claiming the node user's counts
    assert exported(FallbackRows(folder)) == {}
    assert not path.exists()


@pytest.mark.parametrize(
    "document",
    [
        {"application": APP, "rows": {"m": -1}},
        {"application": APP, "rows": {"m": True}},
        {"application": "a b", "rows": {"m": 1}},
        {"application": APP, "rows": {"../m": 1}},
        {"application": APP, "rows": {f"m{i}": 1 for i in range(17)}},
        ["not", "an", "object"],
    ],
    ids=["negative", "boolean", "application-with-space", "model-path", "17-models", "list"],
)
def test_a_malformed_report_is_removed_and_counts_nothing(folder: Path, document: object) -> None:
    path = write_report(folder, os.geteuid(), "0123456789abcdef", document)
    assert exported(FallbackRows(folder)) == {}
    assert not path.exists()


def test_a_report_larger_than_the_bound_is_removed_unread(folder: Path) -> None:
    path = folder / f"{os.geteuid()}-0123456789abcdef.json"
    path.write_text(json.dumps({"application": APP, "rows": {"m": 1}}) + " " * (16 << 10))
    assert exported(FallbackRows(folder)) == {}
    assert not path.exists()


def test_a_symbolic_link_in_the_folder_is_removed_not_followed(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"application": APP, "rows": {"m": 1}}))
    link = folder / f"{os.geteuid()}-0123456789abcdef.json"
    link.symlink_to(target)
    assert exported(FallbackRows(folder)) == {}
    assert not link.is_symlink() and target.exists()


def test_series_beyond_the_bound_are_counted_under_other(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fallback_metrics, "MAX_FALLBACK_SERIES", 3)
    for i in range(5):
        write_report(folder, os.geteuid(), f"{i:016x}", {"application": f"app-{i}", "rows": {"m": 10}})
    found = exported(FallbackRows(folder))
    assert len(found) == 4
    assert found[("other", "other", "node")] == 20
    assert sum(found.values()) == 50


def test_one_scrape_reads_at_most_the_bound_of_files_and_the_next_goes_on_from_there(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fallback_metrics, "MAX_REPORT_FILES", 10)
    for i in range(25):
        write_report(folder, os.geteuid(), f"{i:016x}", {"application": APP, "rows": {"m": 1}})
    collector = FallbackRows(folder)
    assert exported(collector) == {("m", APP, "node"): 10}
    assert exported(collector) == {("m", APP, "node"): 20}  # the next ten, in turn
    assert exported(collector) == {("m", APP, "node"): 25}
    assert exported(collector) == {("m", APP, "node"): 25}  # none counted twice


def test_a_report_unchanged_past_the_retention_is_removed_after_it_is_counted(folder: Path) -> None:
    path = write_report(folder, os.geteuid(), "0123456789abcdef", {"application": APP, "rows": {"m": 4}})
    os.utime(path, (1_000_000, 1_000_000))
    assert exported(FallbackRows(folder, retention_s=3600)) == {("m", APP, "node"): 4}
    assert not path.exists()


def test_the_client_refuses_a_folder_others_may_write_without_the_sticky_bit(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(
        UntrustedNodeFile, match=r"mode 0777: others may replace its files; expected 0700 or 1733"
    ):
        check_reports_folder(folder, frozenset({os.geteuid(), 0}))


def test_a_temporary_file_left_for_over_a_minute_is_removed_and_a_fresh_one_kept(folder: Path) -> None:
    left, fresh = folder / ".left.tmp", folder / ".fresh.tmp"
    left.write_text("{}")
    fresh.write_text("{}")
    os.utime(left, (1_000_000, 1_000_000))
    assert exported(FallbackRows(folder)) == {}
    assert not left.exists() and fresh.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_reports_of_one_other_user_beyond_the_bound_are_removed_unread(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fallback_metrics, "MAX_REPORTS_PER_OTHER_USER", 3)
    for i in range(5):
        path = write_report(folder, OTHER_UID, f"{i:016x}", {"application": APP, "rows": {"m": 1}})
        os.chown(path, OTHER_UID, OTHER_UID)
    ours = write_report(folder, os.geteuid(), f"{9:016x}", {"application": APP, "rows": {"m": 7}})

    assert exported(FallbackRows(folder)) == {("m", APP, "other"): 3, ("m", APP, "node"): 7}
    assert len(list(folder.iterdir())) == 4 and ours.exists()


def test_the_node_users_reports_are_read_before_the_others(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    monkeypatch.setattr(fallback_metrics, "MAX_REPORT_FILES", 2)
    for i in range(3):
        path = write_report(folder, OTHER_UID, f"{i:016x}", {"application": APP, "rows": {"m": 1}})
        os.chown(path, OTHER_UID, OTHER_UID)
    write_report(folder, os.geteuid(), f"{9:016x}", {"application": APP, "rows": {"m": 7}})

    assert exported(FallbackRows(folder)) == {("m", APP, "node"): 7, ("m", APP, "other"): 1}


def test_a_name_that_is_not_a_reports_is_removed(folder: Path) -> None:
    stray = folder / "notes.txt"
    stray.write_text("hello")
    assert exported(FallbackRows(folder)) == {}
    assert not stray.exists()


def test_a_flood_of_stray_files_is_logged_in_one_line_a_scrape(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(50):
        (folder / f"stray-{i}").write_text("x")
    with caplog.at_level(logging.WARNING, logger=fallback_metrics.__name__):
        exported(FallbackRows(folder))

    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith("removed 50 file(s) from the fallback reports folder (first: ")
    assert "not named <uid>-<16 hex digits>.json" in line
