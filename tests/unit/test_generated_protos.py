"""The checked-in gRPC code is what the .proto files generate today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_protocol_code_is_up_to_date_with_the_proto_files() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_protos.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"run `python scripts/generate_protos.py`: {result.stderr}"
