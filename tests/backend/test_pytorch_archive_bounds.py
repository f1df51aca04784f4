"""A PyTorch model file is bounded by what its zip directory declares before anything in it is
unpacked: a zip bomb (a real model's archive with one entry replaced by 1.9 GB of deflated zeros,
a file of 1.9 MB) is refused naming the file, the entry and the sizes, in the memory a good model
takes to load, wherever the bomb sits (an entry torch reads and the checks do not, a record the
checks read whose directory understates it, the sample inputs' own zip, TorchScript).

The loads that could unpack gigabytes run in a child process under a cap on its data
(``RLIMIT_DATA``, 1.5 GiB), so that a regression fails the test (an empty ``MemoryError``, as the
code before this bound failed) instead of taking the machine's memory; the child reports its own
peak resident memory, compared with that of a child loading the real model.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch_programs import conv_net_repository
from zip_bombs import deflated, deflated_zeros, stored, with_entry_replaced, write_zip

from udfserve.runtime.backends.pytorch import device as pytorch_device
from udfserve.runtime.errors import ModelLoadError
from udfserve.runtime.repository import load_model, scan_repository

logger = logging.getLogger(__name__)

BOMB_BYTES = 1900 << 20
"""What the bomb entry unpacks to: 1.9 GB of zeros, 1.9 MB deflated."""
CHILD_DATA_CAP_BYTES = 3 << 29
"""The child's data may reach 1.5 GiB: a good load needs about 330 MiB, the bomb 1.9 GB."""
MEMORY_SLACK_BYTES = 64 << 20
"""A refused load peaks no higher than a good load of the real model plus this."""

LOAD_IN_A_CHILD = """
import json, resource, sys
from pathlib import Path
cap = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
from udfserve.runtime.repository import load_model, scan_repository
source = scan_repository(Path(sys.argv[1])).sources[0]
try:
    load_model(source)
    error = None
except BaseException as exc:  # MemoryError included: what the load died of, in words
    error = f"{type(exc).__name__}: {exc}"[:2000]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"error": error, "peak_bytes": peak}))
"""


def load_in_a_child(repository: Path) -> tuple[str | None, int]:
    """The error a load of the repository's one model fails with in a fresh process (None: it
    loaded), and that process's peak resident memory in bytes."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD_IN_A_CHILD, str(repository), str(CHILD_DATA_CAP_BYTES)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"the child exited {done.returncode}: {done.stderr[-2000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    logger.info(
        "%s: peak %.0f MiB, %s", repository, report["peak_bytes"] / (1 << 20), report["error"] or "loaded"
    )
    return report["error"], report["peak_bytes"]


def one_model(
    root: Path, file_name: str, data: Path | bytes, config: dict[str, object] | None = None
) -> Path:
    """A repository holding model ``m`` version 1 with one model file."""
    version_dir = root / "m" / "1"
    version_dir.mkdir(parents=True)
    target = version_dir / file_name
    if isinstance(data, Path):
        data.rename(target)
    else:
        target.write_bytes(data)
    if config is not None:
        (root / "m" / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def load_failure(repository: Path) -> str:
    source = scan_repository(repository).sources[0]
    with pytest.raises(ModelLoadError) as raised:
        load_model(source)
    return str(raised.value)


@pytest.fixture(scope="module")
def conv_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return conv_net_repository(tmp_path_factory.mktemp("conv")) / "m" / "1" / "model.pt2"


@pytest.fixture(scope="module")
def good_load_peak_bytes(conv_program: Path) -> int:
    """What a child loading the real model (and warming it up) peaks at."""
    error, peak = load_in_a_child(conv_program.parent.parent.parent)
    assert error is None, error
    return peak


@pytest.fixture(scope="module")
def script_bytes() -> bytes:
    class Scored(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(6, 2)

        def forward(self, values: torch.Tensor) -> torch.Tensor:
            return self.linear(values)

    buffer = io.BytesIO()
    with pytest.warns(DeprecationWarning, match="torch.jit.* is deprecated"):  # since torch 2.13
        torch.jit.save(torch.jit.script(Scored().eval()), buffer)
    return buffer.getvalue()


# -- what torch writes, which the bound is made from ------------------------------------------------
def test_torch_stores_a_programs_entries_and_deflates_only_torchscript_code(
    conv_program: Path, script_bytes: bytes
) -> None:
    with zipfile.ZipFile(conv_program) as program:
        assert {info.compress_type for info in program.infolist()} == {zipfile.ZIP_STORED}
        assert sum(info.file_size for info in program.infolist()) < conv_program.stat().st_size
    with zipfile.ZipFile(io.BytesIO(script_bytes)) as script:
        deflated = [info for info in script.infolist() if info.compress_type == zipfile.ZIP_DEFLATED]
    assert deflated and all("/code/" in info.filename for info in deflated)
    assert max(info.file_size / info.compress_size for info in deflated) < 10


# -- bombs, each loaded in a child ------------------------------------------------------------------
@pytest.mark.slow
def test_a_weight_that_unpacks_to_gigabytes_is_refused_from_the_directory_in_a_good_loads_memory(
    conv_program: Path, good_load_peak_bytes: int, tmp_path: Path
) -> None:
    """torch.export.load unpacks every weight; the checks before read none of them."""
    bomb = with_entry_replaced(
        conv_program, "weights/weight_0", deflated_zeros(BOMB_BYTES), tmp_path / "bomb.pt2"
    )
    assert bomb.stat().st_size < 2_000_000
    repository = one_model(tmp_path / "repo", "model.pt2", bomb)

    error, peak = load_in_a_child(repository)

    assert error is not None and error.startswith("ModelLoadError: "), error
    assert f"{repository / 'm' / '1' / 'model.pt2'} holds model/data/weights/weight_0" in error
    assert f"unpacks to {BOMB_BYTES:,} bytes from " in error
    assert "over 100 to 1 is refused unread (a zip bomb)" in error
    assert peak < good_load_peak_bytes + MEMORY_SLACK_BYTES, (peak, good_load_peak_bytes)


@pytest.mark.slow
def test_a_program_record_whose_directory_understates_it_is_unpacked_no_further_than_declared(
    conv_program: Path, good_load_peak_bytes: int, tmp_path: Path
) -> None:
    """The directory says 13 KB of JSON; the data is 1.9 GB of deflated zeros. ``ZipFile.read``
    inflates all of it in one step before cutting it to the declared size."""
    with zipfile.ZipFile(conv_program) as program:
        declared = next(info for info in program.infolist() if info.filename.endswith("models/model.json"))
    lying = deflated_zeros(BOMB_BYTES, declared_size=declared.file_size, crc=declared.CRC)
    repository = one_model(
        tmp_path / "repo",
        "model.pt2",
        with_entry_replaced(conv_program, "models/model.json", lying, tmp_path / "lying.pt2"),
    )

    error, peak = load_in_a_child(repository)

    assert error is not None and error.startswith("ModelLoadError: "), error
    assert (
        f"holds model/models/model.json, which does not unpack to the {declared.file_size:,} bytes "
        "its directory record declares" in error
    )
    assert peak < good_load_peak_bytes + MEMORY_SLACK_BYTES, (peak, good_load_peak_bytes)


@pytest.mark.slow
def test_sample_inputs_whose_own_zip_is_a_bomb_are_refused_before_torch_load_reads_them(
    conv_program: Path, good_load_peak_bytes: int, tmp_path: Path
) -> None:
    """The sample inputs are a torch.save archive stored whole in the program's: as torch writes it,
    one stored entry, so only their own directory tells."""
    inner = tmp_path / "inputs.pt"
    with zipfile.ZipFile(conv_program) as program:
        inner.write_bytes(program.read("model/data/sample_inputs/model.pt"))
    inner_bomb = with_entry_replaced(inner, "archive/data/0", deflated_zeros(BOMB_BYTES), tmp_path / "b.pt")
    repository = one_model(
        tmp_path / "repo",
        "model.pt2",
        with_entry_replaced(
            conv_program, "sample_inputs/model.pt", stored(inner_bomb.read_bytes()), tmp_path / "outer.pt2"
        ),
    )

    error, peak = load_in_a_child(repository)

    assert error is not None and error.startswith("ModelLoadError: "), error
    assert "holds sample inputs (data/sample_inputs/model.pt), a zip archive of their own, which" in error
    assert f"holds archive/data/0, which its directory says unpacks to {BOMB_BYTES:,} bytes" in error
    assert peak < good_load_peak_bytes + MEMORY_SLACK_BYTES, (peak, good_load_peak_bytes)


@pytest.mark.slow
def test_a_torchscript_tensor_that_unpacks_to_gigabytes_is_refused_in_a_good_loads_memory(
    script_bytes: bytes, good_load_peak_bytes: int, tmp_path: Path
) -> None:
    (tmp_path / "model.pt").write_bytes(script_bytes)
    bomb = with_entry_replaced(tmp_path / "model.pt", "data/0", deflated_zeros(BOMB_BYTES), tmp_path / "b.pt")
    tensor_entry = next(name for name in zipfile.ZipFile(bomb).namelist() if name.endswith("/data/0"))
    config = {"inputs": [{"name": "values", "shape": [6]}], "outputs": [{"name": "scores", "shape": [2]}]}
    repository = one_model(tmp_path / "repo", "model.pt", bomb, config)

    error, peak = load_in_a_child(repository)

    assert error is not None and error.startswith("ModelLoadError: "), error
    assert f"model.pt holds {tensor_entry}, which its directory says unpacks to {BOMB_BYTES:,} bytes" in error
    assert peak < good_load_peak_bytes + MEMORY_SLACK_BYTES, (peak, good_load_peak_bytes)


# -- the rules, in process --------------------------------------------------------------------------
def test_an_archive_unpacking_beyond_twice_its_size_is_refused_at_a_ratio_zip_tools_reach(
    conv_program: Path, tmp_path: Path
) -> None:
    """100 MiB deflated about 60 to 1: within the ratio allowed, beyond 2 x 1.7 MB + 64 MiB."""
    rng = np.random.default_rng(0)
    block = 64 << 10
    noisy = 1 << 10
    chunks = [
        rng.integers(0, 256, noisy, dtype=np.uint8).tobytes() + bytes(block - noisy) for _ in range(1600)
    ]
    entry = deflated(chunks)
    assert 20 < entry.declared_size / entry.compressed_size < 100
    repository = one_model(
        tmp_path / "repo",
        "model.pt2",
        with_entry_replaced(conv_program, "weights/weight_0", entry, tmp_path / "dense.pt2"),
    )

    message = load_failure(repository)

    assert "model.pt2 unpacks to " in message
    assert f"the largest model/data/weights/weight_0 of {block * len(chunks):,}" in message
    assert "(twice its size plus 64 MiB; UDFSERVE_TORCH_MAX_UNPACKED_BYTES sets another bound)" in message


def test_an_entry_compressed_with_bzip2_is_refused_naming_the_method(
    conv_program: Path, tmp_path: Path
) -> None:
    """zipfile unpacks bzip2 in one step whatever it is asked for; torch's reader cannot read it."""
    archive = tmp_path / "bzip2.pt2"
    with zipfile.ZipFile(conv_program) as source, zipfile.ZipFile(archive, "w") as target:
        for info in source.infolist():
            method = zipfile.ZIP_BZIP2 if info.filename.endswith("archive_format") else zipfile.ZIP_STORED
            target.writestr(info.filename, source.read(info), compress_type=method)
    message = load_failure(one_model(tmp_path / "repo", "model.pt2", archive))
    assert (
        "model.pt2 holds model/archive_format compressed with bzip2; torch reads entries stored or deflated"
        in message
    )


def test_the_setting_bounds_what_a_real_model_may_unpack_to(
    conv_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pytorch_device, "_placement", None)  # settings are read with the placement
    monkeypatch.setenv("UDFSERVE_TORCH_MAX_UNPACKED_BYTES", "4096")
    message = load_failure(one_model(tmp_path / "repo", "model.pt2", conv_program.read_bytes()))
    unpacked = sum(info.file_size for info in zipfile.ZipFile(conv_program).infolist())
    assert f"model.pt2 unpacks to {unpacked:,} bytes" in message
    assert "more than the 4,096 allowed" in message and "(UDFSERVE_TORCH_MAX_UNPACKED_BYTES)" in message


def test_a_setting_beyond_the_hard_maximum_fails_the_load_naming_the_variable(
    conv_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pytorch_device, "_placement", None)
    monkeypatch.setenv("UDFSERVE_TORCH_MAX_UNPACKED_BYTES", str(2 << 40))
    message = load_failure(one_model(tmp_path / "repo", "model.pt2", conv_program.read_bytes()))
    assert (
        f"UDFSERVE_TORCH_MAX_UNPACKED_BYTES='{2 << 40}': Input should be less than or equal to {1 << 40}"
        in message
    )


def test_a_program_written_entry_by_entry_as_torch_writes_it_loads(
    conv_program: Path, tmp_path: Path
) -> None:
    """The bombs above are this archive with one entry replaced: the writer itself changes nothing."""
    with zipfile.ZipFile(conv_program) as source:
        entries = [(info.filename, stored(source.read(info))) for info in source.infolist()]
    repository = one_model(tmp_path / "repo", "model.pt2", write_zip(tmp_path / "copy.pt2", entries))
    model = load_model(scan_repository(repository).sources[0])
    assert [spec.name for spec in model.inputs] == ["image", "offset"]
