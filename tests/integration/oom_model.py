"""A SavedModel that genuinely runs out of memory, for the out-of-memory tests of the server.

``doubled_sum = 2 * sum(features, axis=1)``. For a batch of more than ``fits_rows`` rows, or holding
a row whose first feature is at least ``HUGE_ROW_MARKER`` (a row too big to fit alone), the graph
asks the allocator for a scratch tensor of 2**60 bytes, which no machine can give: TensorFlow's own
allocator fails and the framework raises its own ``ResourceExhaustedError`` ("OOM when allocating
tensor ..."), as when a batch does not fit on a GPU. Nothing in the model raises by hand.

Run it as a script, so the test process never imports TensorFlow:

    python oom_model.py <repository> <fits_rows> <max_batch_size>

writes ``<repository>/oom_sum/{config.yaml,1/saved_model.pb,...}``. The config turns warm-up off:
warming up at ``max_batch_size`` rows would fail the load of a model that cannot run them.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

MODEL_NAME = "oom_sum"
FEATURES = 4
HUGE_ROW_MARKER = 1.0e6
IMPOSSIBLE_BYTES = 1 << 60  # beyond any address space: the allocation fails at once


def write_oom_model(repository: Path, fits_rows: int, max_batch_size: int) -> Path:
    """Export the model and its config.yaml; returns the model folder."""
    import tensorflow as tf
    import yaml

    class OutOfMemoryAboveRows(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="features")])
        def serve(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
            rows = tf.shape(features, out_type=tf.int64)[0]
            too_big = tf.logical_or(rows > fits_rows, tf.reduce_any(features[:, 0] >= HUGE_ROW_MARKER))
            scratch_bytes = tf.where(
                too_big, tf.constant(IMPOSSIBLE_BYTES, tf.int64), tf.constant(1, tf.int64)
            )
            scratch = tf.fill(tf.reshape(scratch_bytes, [1]), tf.constant(0, tf.uint8))
            touched = tf.cast(tf.reduce_max(scratch), tf.float32)  # 0, but the graph must allocate it
            return {"doubled_sum": 2.0 * tf.reduce_sum(features, axis=1) + touched}

    model_dir = repository / MODEL_NAME
    module = OutOfMemoryAboveRows()
    tf.saved_model.save(module, str(model_dir / "1"), signatures={"serving_default": module.serve})
    config = {
        "max_batch_size": max_batch_size,
        "warmup": False,
        "dynamic_batching": {"max_queue_delay_s": 0.002},
    }
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return model_dir


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    repository_arg, fits_rows_arg, max_batch_size_arg = sys.argv[1:4]
    write_oom_model(Path(repository_arg), int(fits_rows_arg), int(max_batch_size_arg))
