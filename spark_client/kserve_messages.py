"""Arrow batches to and from KServe v2 messages, for any KServe v2 peer (udfserve or Triton).

The public face of ``udfserve.spark_client.wire.kserve_messages``, the codec that
``protocol="kserve"`` itself runs (docs/kserve.md, "For clients"): a program that talks KServe v2
without Spark imports these four functions from here. They are defined once, in that module.
Importing this module imports ``tritonclient`` (the ``kserve`` extra).
"""

from __future__ import annotations

from udfserve.spark_client.wire.kserve_messages import (
    arrow_batch_to_infer_request,
    infer_response_to_arrow,
    specs_from_config,
    specs_from_metadata,
)

__all__ = [
    "arrow_batch_to_infer_request",
    "infer_response_to_arrow",
    "specs_from_config",
    "specs_from_metadata",
]
