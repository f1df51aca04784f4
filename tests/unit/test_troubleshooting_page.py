"""docs/troubleshooting.md shows a transcript of every case the doctor's tests run, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"<!-- transcript: ([a-z0-9-]+) -->\n(.*?)<!-- /transcript -->", re.DOTALL)


def cases_the_tests_record() -> set[str]:
    sources = "".join(path.read_text() for path in (ROOT / "tests" / "node").glob("test_doctor*.py"))
    return set(re.findall(r'run_doctor\(\s*"([a-z0-9-]+)"', sources))


def test_the_page_holds_a_block_for_each_case_the_tests_record_and_no_other() -> None:
    assert {case for case, _ in BLOCK.findall(PAGE)} == cases_the_tests_record()


def test_each_block_holds_the_transcript_of_a_run_with_its_exit_code() -> None:
    for case, text in BLOCK.findall(PAGE):
        assert text.startswith("```text\n$ ") and "udfserve doctor" in text.splitlines()[1], case
        assert re.search(r"\$ echo \$\?\n[01]\n```\n$", text), f"{case}: no exit code at the end"


def test_the_page_names_no_path_of_the_checkout_it_was_made_in() -> None:
    assert str(ROOT) not in PAGE
