"""The Spark client's payload files: one per batch in flight, reused, answers copied out, none left."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import decode_batch
from udfserve.shared_memory import FILE_NAME_PATTERN, write_ipc_into
from udfserve.spark_client.wire.shared_memory import SPARE_FILES, SharedMemoryPayloads


def batch(rows: int, value: float = 1.0) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(np.full(rows, value, dtype=np.float32))})


def files(folder: Path) -> list[Path]:
    return sorted(folder.iterdir())


def read_region(region: pb.SharedMemoryRegion) -> pa.RecordBatch:
    with open(region.path, "rb") as handle:
        handle.seek(region.offset)
        return decode_batch(handle.read(region.size))


def answer_in(region: pb.SharedMemoryRegion, answer: pa.RecordBatch) -> int:
    """Write ``answer`` into an output region, as the server does; the bytes written."""
    with open(region.path, "r+b") as handle:
        handle.seek(region.offset)
        room = bytearray(region.size)
        written = write_ipc_into(pa.py_buffer(room), answer)
        assert written is not None
        handle.write(room[:written])
    return written


def test_a_placed_batch_is_the_arrow_stream_at_the_start_of_a_file_named_for_servers(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=2)
    source, room = payloads.place(1, batch(10, 3.0))
    assert read_region(source).equals(batch(10, 3.0))
    assert room.path == source.path and room.offset >= source.size and room.size >= source.size
    assert FILE_NAME_PATTERN.match(Path(source.path).name)
    assert (Path(source.path).stat().st_mode & 0o777) == 0o600


def test_a_file_is_reused_once_its_batch_is_answered(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=2)
    first, _ = payloads.place(1, batch(100))
    payloads.release(1)
    second, _ = payloads.place(2, batch(100))
    assert second.path == first.path
    assert len(files(tmp_path)) == 1


def test_batches_in_flight_each_have_their_own_file(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=3)
    paths = {payloads.place(batch_id, batch(100))[0].path for batch_id in (1, 2, 3)}
    assert len(paths) == 3


def test_a_batch_too_large_for_the_free_files_gets_a_new_one_and_the_spares_stay_bounded(
    tmp_path: Path,
) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=1)
    for batch_id, rows in enumerate((100, 50_000, 200_000, 1_000_000, 3_000_000), start=1):
        payloads.place(batch_id, batch(rows))
        payloads.release(batch_id)
    assert len(files(tmp_path)) <= 1 + SPARE_FILES


def test_an_answer_is_copied_out_so_reusing_its_file_leaves_it_intact(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=1)
    _, room = payloads.place(1, batch(64))
    size = answer_in(room, batch(64, 7.0))
    result = payloads.answer(1, size)
    _, room_again = payloads.place(2, batch(64))
    answer_in(room_again, batch(64, -1.0))
    assert room_again.path == room.path
    assert result.equals(batch(64, 7.0))


def test_an_answer_larger_than_its_room_is_refused_naming_both_sizes(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=1)
    _, room = payloads.place(1, batch(8))
    with pytest.raises(ValueError, match=rf"{room.size + 1} bytes of answer .* {room.size} bytes of room"):
        payloads.answer(1, room.size + 1)


def test_an_answer_to_a_batch_that_holds_no_file_is_refused(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=1)
    with pytest.raises(ValueError, match=r"batch 9 .* no file"):
        payloads.answer(9, 100)


def test_close_unlinks_every_file_busy_or_free(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=3)
    payloads.place(1, batch(10))
    payloads.place(2, batch(10))
    payloads.release(2)
    payloads.close()
    assert files(tmp_path) == []
    assert payloads.place(3, batch(10)) is None


def test_once_placing_stops_batches_go_inline_and_answers_are_still_read(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=2)
    _, room = payloads.place(1, batch(16))
    payloads.placing = False
    assert payloads.place(2, batch(16)) is None
    assert payloads.answer(1, answer_in(room, batch(16, 2.0))).equals(batch(16, 2.0))


def test_a_missing_folder_means_inline(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path / "absent", max_in_flight=1)
    assert payloads.place(1, batch(4)) is None


FULL_FOLDER_PROBE = """
import sys
from pathlib import Path
import numpy as np, pyarrow as pa
from udfserve.spark_client.wire.shared_memory import SharedMemoryPayloads
payloads = SharedMemoryPayloads(Path(sys.argv[1]), max_in_flight=2)
small = pa.record_batch({"x": pa.array(np.ones(1000, dtype=np.float32))})
large = pa.record_batch({"x": pa.array(np.ones(1_000_000, dtype=np.float32))})
placed_small = payloads.place(1, small) is not None
placed_large = payloads.place(2, large) is not None
print(placed_small, placed_large, len(list(Path(sys.argv[1]).iterdir())))
"""


def test_a_full_shared_memory_folder_sends_the_batch_inline_instead_of_crashing(tmp_path: Path) -> None:
    """A store through a mapping of a full tmpfs is a SIGBUS; the reservation must fail first.
    The child mounts a 1 MiB tmpfs in a mount namespace of its own and places a 4 MB batch."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    script = (
        f"mount -t tmpfs -o size=1m tmpfs {folder} && exec {sys.executable} -c '{FULL_FOLDER_PROBE}' {folder}"
    )
    completed = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.split() == ["True", "False", "1"]


def test_a_process_that_exits_without_closing_its_pool_leaves_no_file(tmp_path: Path) -> None:
    probe = (
        "import sys; from pathlib import Path; import pyarrow as pa; "
        "from udfserve.spark_client.wire.shared_memory import SharedMemoryPayloads; "
        "payloads = SharedMemoryPayloads(Path(sys.argv[1]), max_in_flight=2); "
        "assert payloads.place(1, pa.record_batch({'x': pa.array([1.0, 2.0])})) is not None; "
        "print(len(list(Path(sys.argv[1]).iterdir())))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "1"  # the file existed while the process ran
    assert files(tmp_path) == []


def test_a_pool_dropped_without_close_unlinks_its_files(tmp_path: Path) -> None:
    payloads = SharedMemoryPayloads(tmp_path, max_in_flight=2)
    payloads.place(1, batch(10))
    assert len(files(tmp_path)) == 1
    del payloads
    gc.collect()
    assert files(tmp_path) == []


def test_files_for_a_group_are_readable_and_writable_by_it_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        payloads = SharedMemoryPayloads(tmp_path, max_in_flight=1, group_access=True)
        source, _ = payloads.place(1, batch(10))
    finally:
        os.umask(previous)
    assert (Path(source.path).stat().st_mode & 0o777) == 0o660
    payloads.close()


@pytest.mark.parametrize(("folder_mode", "warnings"), [(0o770, 1), (0o2770, 0)])
def test_files_for_a_group_in_a_folder_without_setgid_are_warned_of_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, folder_mode: int, warnings: int
) -> None:
    """Without the setgid bit the files would belong to the executor's own group."""
    tmp_path.chmod(folder_mode)
    with caplog.at_level("WARNING", logger="udfserve.spark_client.wire.shared_memory"):
        SharedMemoryPayloads(tmp_path, max_in_flight=1, group_access=True).close()
        SharedMemoryPayloads(tmp_path, max_in_flight=1, group_access=True).close()
    said = [r.getMessage() for r in caplog.records if "setgid" in r.getMessage()]
    assert len(said) == warnings and all(str(tmp_path) in message for message in said)
