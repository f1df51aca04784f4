"""A SavedModel whose computation is genuinely slow, for the client's deadline tests.

``doubled_sum = 2 * sum(features, axis=1)``, computed after a ``tf.while_loop`` of
``iterations`` dense 256x256 ``tanh`` layers over every row: the time grows with rows times
iterations, and the loop cannot be folded away (its result decides a term that is always 0).
This is real work, so its time grows with the machine's load, as a real model's does. The same
model written with one iteration is fast and computes the same numbers, so a test can serve the
slow one and let the CPU fallback load the fast one.

With ``sleep_s`` the model instead sleeps that long in every call (a ``SleepDataset`` in the
graph: no CPU spent), before the same numbers: a server that cannot answer within any deadline a
test sets, however loaded the machine is, without slowing the other tests down.

Run it as a script, so the test process never imports TensorFlow:

    python slow_model.py <repository> <iterations> [<sleep_s>]

writes ``<repository>/slow_sum/{config.yaml,1/saved_model.pb,...}`` with warm-up off (a warm-up
at ``max_batch_size`` rows would take as long as the slowness it is there to show).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

MODEL_NAME = "slow_sum"
FEATURES = 4
WIDTH = 256


def write_slow_model(repository: Path, iterations: int, sleep_s: float = 0.0) -> Path:
    """Export the model and its config.yaml; returns the model folder."""
    import numpy as np
    import tensorflow as tf
    import yaml
    from tensorflow.python.data.experimental.ops import testing as dataset_testing

    weights = tf.constant(np.random.default_rng(0).normal(0, 0.05, (WIDTH, WIDTH)).astype(np.float32))

    class SlowSum(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="features")])
        def serve(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
            hidden = tf.tile(features, [1, WIDTH // FEATURES])

            def step(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                return i + 1, tf.tanh(tf.matmul(h, weights))

            _, hidden = tf.while_loop(lambda i, _h: i < iterations, step, [tf.constant(0), hidden])
            never = tf.cast(tf.reduce_max(tf.abs(hidden)) > 2.0, tf.float32)  # tanh stays within 1
            if sleep_s > 0:  # the answer waits for a dataset that sleeps before yielding it
                slept = tf.data.Dataset.from_tensors(features).apply(
                    dataset_testing.sleep(int(sleep_s * 1_000_000))
                )
                features = slept.reduce(tf.zeros_like(features), lambda total, element: total + element)
            return {"doubled_sum": 2.0 * tf.reduce_sum(features, axis=1) + never}

    model_dir = repository / MODEL_NAME
    module = SlowSum()
    tf.saved_model.save(module, str(model_dir / "1"), signatures={"serving_default": module.serve})
    config = {"max_batch_size": 4096, "warmup": False, "dynamic_batching": {"max_queue_delay_s": 0.002}}
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return model_dir


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    repository_arg, iterations_arg, *sleep_arg = sys.argv[1:4]
    write_slow_model(Path(repository_arg), int(iterations_arg), float(sleep_arg[0]) if sleep_arg else 0.0)
