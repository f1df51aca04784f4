"""Coverage-guided fuzzing of a request's decoding path with atheris (libFuzzer for Python).

The property is the one ``tests/unit/test_hostile_input.py`` checks with hypothesis: decoding the
Arrow IPC payload and checking it against a model's inputs raises ``ArrowPayloadError`` or
``InvalidInput`` (answered INVALID_ARGUMENT) and nothing else (which would be answered INTERNAL).
Here libFuzzer mutates the bytes, guided by the coverage of our Python modules (pyarrow's C++ is
not instrumented), starting from valid payloads of each model shape.

    python -m tests.fuzz.fuzz_decode -max_total_time=60        # seeds in a temporary folder
    python -m tests.fuzz.fuzz_decode -runs=200000 my_corpus/   # libFuzzer flags and folders

The first byte of an input picks the model; the rest is the payload. A crash leaves the input in
``crash-<sha1>`` in the working folder; replay it by passing that file instead of a folder.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import atheris
import numpy as np
import pyarrow as pa

with atheris.instrument_imports(include=["udfserve"]):
    from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch
    from udfserve.runtime.errors import InvalidInput
    from udfserve.runtime.tensor_conversion import batch_to_inputs
    from udfserve.runtime.tensor_spec import TensorSpec

logger = logging.getLogger("fuzz_decode")

MODELS: tuple[tuple[TensorSpec, ...], ...] = (
    (TensorSpec(name="features", dtype="float32", shape=(64,)),),
    (TensorSpec(name="lines", dtype="float32", shape=(16, 32)),),
    (TensorSpec(name="numeric", dtype="float32", shape=(8,)), TensorSpec(name="category", dtype="int32")),
    (TensorSpec(name="tokens", dtype="int64", shape=(-1,)),),
    (TensorSpec(name="pixels", dtype="uint8", shape=(3,)), TensorSpec(name="flag", dtype="bool")),
)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    specs = MODELS[data[0] % len(MODELS)]
    try:
        batch = decode_batch(data[1:])
        batch_to_inputs(batch, "fuzzed", specs)
    except (ArrowPayloadError, InvalidInput):
        return


def seed_payloads() -> list[bytes]:
    """A valid payload for each model, and the same as nested and flat lists."""
    rng = np.random.default_rng(0)
    seeds = []
    for index, specs in enumerate(MODELS):
        for form in ("fixed", "list"):
            columns = {}
            for spec in specs:
                dims = [3 if dim == -1 else dim for dim in spec.shape]
                values = rng.integers(0, 100, size=(4, *dims)).astype(spec.dtype).reshape(-1)
                column: pa.Array = pa.array(values)
                for size in reversed(dims):
                    if form == "fixed":
                        column = pa.FixedSizeListArray.from_arrays(column, size)
                    else:
                        offsets = pa.array(np.arange(0, len(column) + 1, size, dtype=np.int32))
                        column = pa.ListArray.from_arrays(offsets, column)
                columns[spec.name] = column
            seeds.append(bytes([index]) + encode_batch(pa.record_batch(columns)))
    return seeds


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    arguments = list(sys.argv)
    if not any(Path(argument).exists() for argument in arguments[1:] if not argument.startswith("-")):
        corpus = Path(tempfile.mkdtemp(prefix="fuzz-decode-corpus-"))
        for number, seed in enumerate(seed_payloads()):
            (corpus / f"seed-{number}").write_bytes(seed)
        logger.info("seed corpus of %d payloads in %s", len(seed_payloads()), corpus)
        arguments.append(str(corpus))
    atheris.Setup(arguments, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
