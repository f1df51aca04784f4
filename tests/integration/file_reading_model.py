"""A SavedModel whose graph reads a file and writes another when it runs, as a hostile one would.

``contents`` answers every row with the bytes of ``secret`` (``tf.io.read_file``), and each call
first copies them to ``marker`` (``tf.io.write_file``). Nothing but TensorFlow's own file ops:
no Python runs at serving time, yet the model reads and writes what the server's user may. The
server warms a model up at load, so a loaded one has written ``marker`` before it serves.

Run it as a script, so the test process never imports TensorFlow:

    python file_reading_model.py <secret> <repository> <marker> [<repository> <marker> ...]

writes ``<repository>/reads_file/1/saved_model.pb`` (and its variables) for each pair: one
repository per server, so each server's model writes a marker of its own.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

MODEL_NAME = "reads_file"
INPUT_NAME = "x"
OUTPUT_NAME = "contents"


def write_file_reading_model(repository: Path, secret: Path, marker: Path) -> Path:
    """Export the model; returns its folder."""
    import tensorflow as tf

    class ReadsAFile(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name=INPUT_NAME)])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            contents = tf.io.read_file(str(secret))
            with tf.control_dependencies([tf.io.write_file(str(marker), contents)]):
                rows = tf.fill(tf.shape(x)[:1], contents)
            return {OUTPUT_NAME: rows}

    model_dir = repository / MODEL_NAME
    module = ReadsAFile()
    tf.saved_model.save(module, str(model_dir / "1"), signatures={"serving_default": module.serve})
    return model_dir


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    secret_arg, *pairs = sys.argv[1:]
    for repository_arg, marker_arg in zip(pairs[::2], pairs[1::2], strict=True):
        write_file_reading_model(Path(repository_arg), Path(secret_arg), Path(marker_arg))
