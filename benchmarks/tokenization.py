"""What the server's tokenization of a text model costs, measured side by side in one run.

The step (``udfserve.runtime.preprocessing.BatchTokenizer``) with the example text classifier's
tokenizer (a WordPiece vocabulary trained on generated sentences, ``max_length`` 64):

- **Batches of short texts**: rows/s of the step alone at 64 and 1,024 generated sentences per
  call, and, with ``--repository`` holding the imported ``text_classifier`` (``udfserve models
  generate --text-classifier``), of its ONNX model on the same tokens and of both together: how
  much of a call the tokenizer takes.
- **One long row**: the time to tokenize one row of ``--long-mib`` MiB of text with the default
  cut (``max_characters``, 32 characters a token kept) and without it (a cut past the text's end).
  The tokens kept are the same; the time is what a client sending one long text costs the server.

The contenders alternate, round after round, in one process; the table gives medians. Rows/s
depend on what else the machine runs.

    python -m benchmarks.tokenization [--rounds 5] [--repository model_repository] [--long-mib 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from udfserve.runtime.model_config import TextPreprocess
from udfserve.runtime.preprocessing import open_tokenizer
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.examples.text_classifier import MAX_LENGTH, generated_texts, train_tokenizer

FEEDS = (
    TensorSpec(name="input_ids", dtype="int64", shape=(-1,)),
    TensorSpec(name="attention_mask", dtype="int64", shape=(-1,)),
)


def tokenizer_file(repository: Path | None, folder: Path) -> Path:
    """The imported example's tokenizer.json, or one trained here as the example trains it."""
    if repository is not None and (repository / "text_classifier" / "1" / "tokenizer.json").is_file():
        return repository / "text_classifier" / "1" / "tokenizer.json"
    path = folder / "tokenizer.json"
    train_tokenizer(generated_texts(5_000)).save(str(path))
    return path


def seconds(call: Callable[[], object], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - started) / repeat


def rows_per_second(call: Callable[[], object], rows: int) -> Callable[[], float]:
    """A contender: ``call`` of ``rows`` rows, 20 times; its rows/s."""
    return lambda: rows / seconds(call, 20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tokenization", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repository", type=Path, default=None, help="holding text_classifier (ONNX)")
    parser.add_argument("--long-mib", type=float, default=4.0, help="MiB of text in the long row")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        path = tokenizer_file(args.repository, Path(folder))
        step = TextPreprocess(max_length=MAX_LENGTH)
        tokenize = open_tokenizer(path, step, FEEDS, "benchmark")
        uncut = open_tokenizer(path, TextPreprocess(max_length=MAX_LENGTH, max_characters=1 << 24), FEEDS, "")
        session = None
        model_file = args.repository / "text_classifier" / "1" / "model.onnx" if args.repository else None
        if model_file is not None and model_file.is_file():
            import onnxruntime

            session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])

        texts = np.array([text.encode() for text in generated_texts(1_024, seed=3)], dtype=object)
        long_row = np.array(
            [("the movie was very good " * int(args.long_mib * (1 << 20) / 24)).encode()], dtype=object
        )
        contenders: dict[str, Callable[[], float]] = {}
        for rows in (64, 1_024):
            batch = texts[:rows]
            contenders[f"tokenize {rows:,} rows"] = rows_per_second(partial(tokenize, batch), rows)
            if session is not None:
                model = partial(session.run, ["probabilities"])
                contenders[f"model alone {rows:,} rows"] = rows_per_second(
                    partial(model, tokenize(batch)), rows
                )
                contenders[f"tokenize + model {rows:,} rows"] = rows_per_second(
                    partial(lambda m, b: m(tokenize(b)), model, batch), rows
                )
        long_runs: dict[str, Callable[[], float]] = {
            "long row, cut (default)": lambda: seconds(lambda: tokenize(long_row), 1),
            "long row, not cut": lambda: seconds(lambda: uncut(long_row), 1),
        }
        assert np.array_equal(tokenize(long_row)["input_ids"], uncut(long_row)["input_ids"])

        rates: dict[str, list[float]] = {name: [] for name in contenders}
        times: dict[str, list[float]] = {name: [] for name in long_runs}
        for _ in range(args.rounds):
            for name, run in contenders.items():
                rates[name].append(run())
            for name, run in long_runs.items():
                times[name].append(run())

    print(f"tokenizer {path.name}, max_length {MAX_LENGTH}, medians of {args.rounds} rounds")
    print(f"{'contender':<32} {'rows/s':>12}")
    for name, values in rates.items():
        print(f"{name:<32} {statistics.median(values):>12,.0f}")
    print(f"{'one row of ' + str(args.long_mib) + ' MiB':<32} {'seconds':>12}")
    for name, values in times.items():
        print(f"{name:<32} {statistics.median(values):>12.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
