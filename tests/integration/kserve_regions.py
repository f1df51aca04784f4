"""What the KServe system shared-memory tests of both front ends share: the tensors' sizes, the
regions a test creates and removes, and the inline answer that a region's answer must equal."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

ROWS = 4
INPUT_BYTES = ROWS * 64 * 4
OUTPUT_BYTES = ROWS * 8 * 4
SHM_FOLDER = Path("/dev/shm")


@contextmanager
def regions_removed_after(
    client: triton_grpc.InferenceServerClient, headers: Mapping[str, str]
) -> Iterator[list[Any]]:
    """The handles of the regions a test creates (``new_region``): every registration is dropped
    and every region destroyed after it, whatever it left."""
    created: list[Any] = []
    yield created
    client.unregister_system_shared_memory(headers=dict(headers))
    for handle in created:
        shm.destroy_shared_memory_region(handle)


def new_region(created: list[Any], byte_size: int) -> tuple[str, str, Any]:
    """A new shared-memory object of ``byte_size`` bytes: its region name, its key, its handle."""
    suffix = uuid.uuid4().hex[:12]
    name, key = f"region-{suffix}", f"/udfserve-test-{suffix}"
    handle = shm.create_shared_memory_region(name, key, byte_size)
    created.append(handle)
    return name, key, handle


def refusal(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        call()
    return raised.value


def inline_answer(
    client: triton_grpc.InferenceServerClient, x: np.ndarray, headers: Mapping[str, str]
) -> np.ndarray:
    """The model's answer for ``x`` sent in the request itself."""
    tensor = triton_grpc.InferInput("features", list(x.shape), "FP32").set_data_from_numpy(x)
    return client.infer("tabular_mlp", [tensor], headers=dict(headers)).as_numpy("probabilities")
