"""A TensorFlow SavedModel with a ``tf.string`` input cast to numbers: ``text`` string (batch,) in,
``value`` = ``tf.strings.to_number(text)`` float32 (batch,) out. A string that is no number (the
empty string included) fails the call.

Run as a script (``python casting_savedmodel.py <version folder>``) so that the test process does
not import TensorFlow for it."""

from __future__ import annotations

import sys
from typing import Any


def save_casting_savedmodel(version_dir: str) -> None:
    import tensorflow as tf

    class Casting(tf.Module):  # type: ignore[misc]
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])  # type: ignore[misc]
        def serve(self, text: Any) -> dict[str, Any]:
            return {"value": tf.strings.to_number(text, out_type=tf.float32)}

    module = Casting()
    tf.saved_model.save(module, version_dir, signatures={"serving_default": module.serve})


if __name__ == "__main__":
    save_casting_savedmodel(sys.argv[1])
