"""Fill docs/troubleshooting.md with the ``udfserve doctor`` transcripts that the tests record.

    .venv/bin/python scripts/troubleshooting_page.py               # run the doctor's tests, fill the page
    .venv/bin/python scripts/troubleshooting_page.py --from DIR    # fill it from transcripts recorded in DIR

Every transcript on the page comes from a real run: the tests of ``tests/node/test_doctor*.py``
start real nodes, break each thing for real, and run the real command (``doctor_harness.py``
writes ``<case>.txt`` when ``DOCTOR_TRANSCRIPTS_DIR`` is set). The page holds each case between
``<!-- transcript: <case> -->`` and ``<!-- /transcript -->``; the text around them is written by
hand and kept. The checkout's path is printed ``<checkout>``. A case the page names that the run
did not record, or one recorded that the page does not name, stops the script: the page and the
tests must agree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
TESTS = [
    "tests/node/test_doctor.py",
    "tests/node/test_doctor_token.py",
    "tests/node/test_doctor_node_faults.py",
]
BLOCK = re.compile(r"(<!-- transcript: (?P<case>[a-z0-9-]+) -->\n).*?(<!-- /transcript -->)", re.DOTALL)


def record(into: Path) -> None:
    """Run the doctor's tests, recording their transcripts into ``into``."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS]
    environment = {**os.environ, "DOCTOR_TRANSCRIPTS_DIR": str(into)}
    done = subprocess.run(command, cwd=ROOT, env=environment, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"the doctor's tests failed (exit code {done.returncode}); the page is left as it was"
        )


def fill(page: str, transcripts: dict[str, str]) -> str:
    """``page`` with each case's block holding its transcript."""
    named = [match.group("case") for match in BLOCK.finditer(page)]
    missing = sorted(set(named) - set(transcripts))
    unplaced = sorted(set(transcripts) - set(named))
    if missing or unplaced:
        raise SystemExit(
            f"the page and the recorded transcripts disagree: named on the page, not recorded: {missing}; "
            f"recorded, not on the page: {unplaced}"
        )

    def block(match: re.Match[str]) -> str:
        text = transcripts[match.group("case")].replace(str(ROOT), "<checkout>")
        return f"{match.group(1)}```text\n{text.rstrip()}\n```\n{match.group(3)}"

    return BLOCK.sub(block, page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="transcripts already recorded (a folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="doctor-transcripts-") as scratch:
        source = args.source
        if source is None:
            source = Path(scratch)
            record(source)
        transcripts = {path.stem: path.read_text() for path in sorted(source.glob("*.txt"))}
        PAGE.write_text(fill(PAGE.read_text(), transcripts))
    print(f"{PAGE.relative_to(ROOT)}: {len(transcripts)} transcripts from {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
