"""A TensorFlow SavedModel whose call runs as long as its input says: ``steps`` int64 (batch, 1)
in, ``y`` = steps + max(steps) as float32 out, counted by a ``tf.while_loop`` of max(steps)
iterations. TensorFlow offers no way to stop such a call from outside once it runs.

Run as a script (``python looping_savedmodel.py <version folder>``) so that the test process does
not import TensorFlow for it."""

from __future__ import annotations

import sys
from typing import Any


def save_looping_savedmodel(version_dir: str) -> None:
    import tensorflow as tf

    class Looping(tf.Module):  # type: ignore[misc]
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.int64, name="steps")])  # type: ignore[misc]
        def serve(self, steps: Any) -> dict[str, Any]:
            trips = tf.reduce_max(steps)
            count = tf.cast(steps, tf.float32)
            _, count = tf.while_loop(
                lambda i, c: i < trips, lambda i, c: (i + 1, c + 1.0), [tf.constant(0, tf.int64), count]
            )
            return {"y": count}

    module = Looping()
    tf.saved_model.save(module, version_dir, signatures={"serving_default": module.serve})


if __name__ == "__main__":
    save_looping_savedmodel(sys.argv[1])
