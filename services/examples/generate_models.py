"""Generate the example model repository: small real Keras models with seeded weights.

The integration tests, the benchmarks and the quick start all serve these, so they cover the
shapes people meet: a flat feature vector (``tabular_mlp``), a window of per-line vectors
through a recurrent layer (``sequence_bilstm``), several named inputs and outputs of
different dtypes and ranks, scalars included (``multi_io``), and a string input (``text_hashing``:
one text per row, hashed into an embedding, as a Spark string column feeds it). Every model
loads with ``safe_mode=True``: no Lambda layers, no custom objects.

    python -m udfserve.services.examples.generate_models --output ./model_repository
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from udfserve.services.examples.backend_examples import (
    add_backend_examples_argument,
    backend_examples_missing,
    generate_backend_examples,
)
from udfserve.services.examples.onnx_models import ONNX_FILE_NAME, ONNX_SUFFIX, save_tabular_mlp_onnx

if TYPE_CHECKING:
    import keras

logger = logging.getLogger(__name__)

KERAS_FILE_NAME = "model.keras"
SAVEDMODEL_SUFFIX = "_savedmodel"
ONNX_EXPORT = f"tabular_mlp{ONNX_SUFFIX}"
"""The folder ``--onnx`` writes ``tabular_mlp``'s ONNX graph to."""


def _tabular_mlp() -> keras.Model:
    import keras

    features = keras.Input(shape=(64,), dtype="float32", name="features")
    hidden = keras.layers.Dense(256, activation="relu", name="dense_1")(features)
    hidden = keras.layers.Dense(256, activation="relu", name="dense_2")(hidden)
    probabilities = keras.layers.Dense(8, activation="softmax", name="probabilities")(hidden)
    return keras.Model(features, probabilities, name="tabular_mlp")


def _sequence_bilstm() -> keras.Model:
    import keras

    lines = keras.Input(shape=(16, 32), dtype="float32", name="lines")
    encoded = keras.layers.Bidirectional(keras.layers.LSTM(32), name="bilstm")(lines)
    probabilities = keras.layers.Dense(4, activation="softmax", name="class_probabilities")(encoded)
    return keras.Model(lines, probabilities, name="sequence_bilstm")


def _multi_io() -> keras.Model:
    import keras

    numeric = keras.Input(shape=(8,), dtype="float32", name="numeric")
    category = keras.Input(shape=(), dtype="int32", name="category")
    category_vector = keras.layers.Embedding(16, 4, name="category_embedding")(category)
    hidden = keras.layers.Concatenate(name="joined")([numeric, category_vector])
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(hidden)
    embedding = keras.layers.Dense(4, name="embedding")(hidden)
    score_column = keras.layers.Dense(1, activation="sigmoid", name="score_column")(hidden)
    # Reshape to () drops the trailing unit axis: a per-row scalar without a Lambda layer.
    score = keras.layers.Reshape((), name="score")(score_column)
    return keras.Model(
        {"numeric": numeric, "category": category},
        {"score": score, "embedding": embedding},
        name="multi_io",
    )


TEXT_HASH_BINS = 1024


def _text_hashing() -> keras.Model:
    import keras

    text = keras.Input(shape=(), dtype="string", name="text")
    token = keras.layers.Hashing(num_bins=TEXT_HASH_BINS, name="hashing")(text)
    vector = keras.layers.Embedding(TEXT_HASH_BINS, 16, name="text_embedding")(token)
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(vector)
    probabilities = keras.layers.Dense(3, activation="softmax", name="probabilities")(hidden)
    return keras.Model(text, probabilities, name="text_hashing")


# name -> (builder, seed, config.yaml contents)
EXAMPLES: dict[str, tuple[Callable[[], Any], int, dict[str, Any]]] = {
    "tabular_mlp": (
        _tabular_mlp,
        1,
        # One call serves a whole 4,096-row request of the Spark client, the fastest call size
        # on a CPU (docs/benchmarks.md, section 3, "Reading the numbers").
        {"max_batch_size": 4096, "dynamic_batching": {"max_queue_delay_s": 0.002}},
    ),
    "sequence_bilstm": (
        _sequence_bilstm,
        2,
        # One call serves a whole 4,096-row request of the Spark client; 256 made it 16 calls.
        {"max_batch_size": 4096, "dynamic_batching": {"max_queue_delay_s": 0.002}},
    ),
    "multi_io": (
        _multi_io,
        3,
        {"max_batch_size": 512, "dynamic_batching": {"max_queue_delay_s": 0.002}},
    ),
    "text_hashing": (
        _text_hashing,
        4,
        {
            "max_batch_size": 1024,
            "dynamic_batching": {"max_queue_delay_s": 0.002},
            "inputs": [{"name": "text", "dtype": "string", "shape": []}],
        },
    ),
}


GENERATE_DESCRIPTION = (
    f"Write the example model repository: {', '.join(EXAMPLES)} (small Keras models with seeded "
    f"weights), with --savedmodel tabular_mlp{SAVEDMODEL_SUFFIX}, with --onnx tabular_mlp_onnx "
    "(the same weights as an ONNX graph; needs the onnx package), and with --text-classifier "
    "text_classifier (a Hugging Face classifier imported to ONNX; needs torch and transformers), and with "
    "--backend-examples the models a backend brings (backend_registry's entries with examples). "
    "Models already present are kept unless --overwrite."
)
"""The help of the generator, shared by ``udfserve models generate`` and this module's own command."""
ONNX_HELP = "also write tabular_mlp as an ONNX graph, tabular_mlp_onnx (needs the onnx package)"


def onnx_missing(flag: str = "--onnx") -> str:
    """Why ``flag`` (which writes ONNX graphs) cannot run here ("" when it can): the graphs are
    built with the onnx package."""
    import importlib.util

    if importlib.util.find_spec("onnx") is not None:
        return ""
    return f"{flag} needs the onnx package, which is not installed: expected `pip install onnx`"


def generate_example_repository(
    root: Path,
    *,
    overwrite: bool = False,
    include_savedmodel: bool = False,
    include_onnx: bool = False,
    include_text_classifier: bool = False,
) -> list[str]:
    """Write the example models under ``root``; returns the names of the example models there.

    ``include_text_classifier`` adds ``text_classifier`` (``udfserve.services.examples.text_classifier``),
    which needs torch and transformers: asked for, never implied, so the default repository stays
    the same whatever is installed.

    Models already present are kept unless ``overwrite`` (and then not even built, so a
    repository that holds them all costs no TensorFlow import). Each model is written to a
    hidden temporary folder and moved into place, so a server scanning ``root`` meanwhile never
    sees half a model.
    """
    from udfserve.runtime.backends.tensorflow.framework import import_tensorflow

    import_tensorflow()  # before keras imports it: its start-up lines go through the filter
    import keras

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for name, (build, seed, config) in EXAMPLES.items():
        exported = f"{name}{SAVEDMODEL_SUFFIX}" if include_savedmodel and name == "tabular_mlp" else None
        onnx_export = f"{name}_onnx" if include_onnx and name == "tabular_mlp" else None
        wanted = [n for n in (name, exported, onnx_export) if n is not None]
        names.extend(wanted)
        missing = [n for n in wanted if overwrite or not _kept(root / n)]
        if not missing:
            continue

        keras.utils.set_random_seed(seed)
        model = build()
        if name in missing:
            _write_model(root, name, config, partial(_save_keras, model))
        if exported in missing:
            # Same layers and weights; outputs as a dict so the signature names the output
            # "probabilities" like the .keras model does (a bare tensor would be "output_0").
            named = keras.Model(model.input, {"probabilities": model.output}, name=exported)
            _write_model(root, exported, config, partial(_save_savedmodel, named))
        if onnx_export in missing:
            _write_model(root, onnx_export, config, partial(save_tabular_mlp_onnx, model))
    if include_text_classifier:
        from udfserve.services.examples.text_classifier import NAME, generate_text_classifier

        generate_text_classifier(root, overwrite=overwrite)
        names.append(NAME)
    return names


VERSION_SEED_STEP = 1000
"""Version N of an example model has the seed of version 1 plus (N - 1) x this: other weights."""


def publish_example_version(root: Path, version: int, only: Sequence[str] = ()) -> list[Path]:
    """Write ``version`` of the example models in ``root`` (or of those ``only`` names), with
    other weights than version 1, the way a version is published to a repository a server
    watches: written into a hidden folder of the model, then renamed to its number, so that a
    server never sees half a version. A folder whose version 1 is ``tabular_mlp``'s ONNX graph
    (``tabular_mlp_onnx``, or a copy of it under another name) gets the graph of the new
    weights. Returns the version folders written."""
    from udfserve.runtime.backends.tensorflow.framework import import_tensorflow

    if version < 2:
        raise ValueError(f"version {version}: expected 2 or more (version 1 is what generate writes)")
    publishable = [*EXAMPLES, ONNX_EXPORT]
    unknown = [name for name in only if name not in publishable]
    if unknown:
        raise ValueError(f"no example model named {unknown}; expected some of {publishable}")
    import_tensorflow()
    import keras

    written = []
    for name in only or [*EXAMPLES, *([ONNX_EXPORT] if (Path(root) / ONNX_EXPORT).is_dir() else [])]:
        model_dir = Path(root) / name
        if not model_dir.is_dir():
            raise FileNotFoundError(f"{model_dir} is not a model folder: generate the repository first")
        target = model_dir / str(version)
        if target.exists():
            raise FileExistsError(f"{target} exists: a published version is never rewritten in place")
        save = _version_writer(model_dir, name)
        build, seed, _config = EXAMPLES[name.removesuffix(ONNX_SUFFIX)]
        keras.utils.set_random_seed(seed + VERSION_SEED_STEP * (version - 1))
        staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=model_dir))
        try:
            save(build(), staging)
            staging.chmod(0o755)  # as readable as version 1: the server may run as another user
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        logger.info("published %s", target)
        written.append(target)
    return written


def _version_writer(model_dir: Path, name: str) -> Callable[[keras.Model, Path], None]:
    """How a new version of ``model_dir`` is written: in the format of its version 1, so that the
    server keeps serving it with the same backend."""
    if not (model_dir / "1" / ONNX_FILE_NAME).is_file():
        return _save_keras
    if name not in ("tabular_mlp", ONNX_EXPORT):
        raise ValueError(
            f"{model_dir / '1' / ONNX_FILE_NAME}: only tabular_mlp's ONNX graph has a version to publish, "
            f"expected the model tabular_mlp or {ONNX_EXPORT}"
        )
    return save_tabular_mlp_onnx


def _kept(target: Path) -> bool:
    """Whether a model folder is present, and so kept (said once, in the log)."""
    if not target.exists():
        return False
    logger.info("keeping %s: already present (pass --overwrite to regenerate it)", target)
    return True


def _save_keras(model: keras.Model, version_dir: Path) -> None:
    model.save(version_dir / KERAS_FILE_NAME)


def _save_savedmodel(model: keras.Model, version_dir: Path) -> None:
    # TensorFlow logs "Assets written to" the staging folder at INFO: a path that is renamed
    # right after, of no use to the reader.
    framework_log = logging.getLogger("tensorflow")
    level = framework_log.level
    framework_log.setLevel(max(level, logging.WARNING))
    try:
        model.export(str(version_dir), format="tf_saved_model", verbose=False)
    finally:
        framework_log.setLevel(level)


def _write_model(root: Path, name: str, config: dict[str, Any], save: Callable[[Path], None]) -> None:
    target = root / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        version_dir = staging / "1"
        version_dir.mkdir()
        save(version_dir)
        (staging / "config.yaml").write_text(
            yaml.safe_dump({"name": name, **config}, sort_keys=False), encoding="utf-8"
        )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info("wrote %s", target)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m udfserve.services.examples.generate_models",
        description=GENERATE_DESCRIPTION,
    )
    parser.add_argument("--output", type=Path, required=True, help="repository folder to write into")
    parser.add_argument("--overwrite", action="store_true", help="regenerate models already present")
    parser.add_argument(
        "--savedmodel", action="store_true", help="also write tabular_mlp as a TensorFlow SavedModel"
    )
    parser.add_argument("--onnx", action="store_true", help=ONNX_HELP)
    parser.add_argument(
        "--text-classifier",
        action="store_true",
        help="also write text_classifier (a Hugging Face classifier exported to ONNX; needs torch and "
        "transformers)",
    )
    add_backend_examples_argument(parser)
    add_publish_arguments(parser)
    args = parser.parse_args(argv)
    if args.onnx and onnx_missing():
        parser.error(onnx_missing())
    if backend_examples_missing(args.backend_examples):
        parser.error(backend_examples_missing(args.backend_examples))
    if "tensorflow" not in sys.modules:
        # Weights are generated on the CPU: the same seeded values on any machine, and no GPU
        # memory taken from a model server that may be running on this node.
        from udfserve.runtime.device import pin_device

        pin_device("cpu")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.publish_version is not None:
        for folder in publish_example_version(args.output, args.publish_version, args.only):
            logger.info("published %s", folder)
        return 0
    names = generate_example_repository(
        args.output,
        overwrite=args.overwrite,
        include_savedmodel=args.savedmodel,
        include_onnx=args.onnx,
        include_text_classifier=args.text_classifier,
    )
    names += generate_backend_examples(args.output, args.backend_examples, overwrite=args.overwrite)
    logger.info("example models in %s: %s", args.output, ", ".join(names))
    return 0


def add_publish_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that publish another version instead of writing the repository."""
    parser.add_argument(
        "--publish-version",
        type=int,
        metavar="N",
        help="instead: publish version N (2 or more) of the example models already in --output, with "
        "other weights, written to a hidden folder and renamed to N (how to publish to a repository "
        "a server watches with --model-control poll); a model whose version 1 is tabular_mlp's ONNX "
        "graph (--onnx) gets the graph of the new weights",
    )
    parser.add_argument(
        "--only",
        type=lambda text: tuple(text.split(",")),
        default=(),
        help="with --publish-version: these models, comma-separated (tabular_mlp_onnx among them)",
    )


if __name__ == "__main__":
    raise SystemExit(main())
