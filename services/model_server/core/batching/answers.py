"""What a request is answered with: the backend's outputs checked, joined in row order, or an error.

- Every output must be an array with exactly one row per input row of the call, else
  ``BackendFault`` naming the output.
- A request whose rows ran in several calls gets their outputs joined in row order; outputs whose
  per-row shapes differ between those calls cannot be joined and fail that request alone
  (``InvalidInput`` naming the output and the shapes).
- ``ServingError`` subclasses reach the caller as they are; anything else a backend raises becomes
  ``BackendFault`` with the exception's type and text. A model that aborted on its input (a panic
  of its tokenizer or framework: ``ModelAborted``, FAILED_PRECONDITION) is logged, as the fault of
  the model it is, once per request it fails.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from udfserve.log_text import error_line
from udfserve.runtime.errors import BackendFault, InvalidInput, ModelAborted, ServingError
from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Arrays, Chunk
from udfserve.services.model_server.core.batching.row_limit import RowLimit

logger = logging.getLogger(__name__)


def set_exception(future: asyncio.Future[Arrays], error: BaseException) -> None:
    """Fail ``future`` unless it is answered or cancelled already."""
    if not future.done():
        future.set_exception(error)


def resolve(chunk: Chunk, outputs: Arrays, compute_s: float, reports: Reports) -> None:
    """Answer ``chunk`` with outputs of calls that took ``compute_s`` in all; a chunk that is its
    whole request is reported here (a request cut into chunks, once they all are: ``whole_request``)."""
    if chunk.future.done():
        return  # cancelled: its client went away
    chunk.compute_s += compute_s
    chunk.future.set_result(outputs)
    if chunk.rows == chunk.request_rows:
        reports.answered([chunk])


def check_outputs(model_name: str, outputs: Arrays, rows: int) -> None:
    """Raise ``BackendFault`` unless every output is an array of ``rows`` rows."""
    for name, array in outputs.items():
        if not isinstance(array, np.ndarray) or array.ndim == 0:
            raise BackendFault(
                f"model '{model_name}': backend output '{name}' is {type(array).__name__} "
                f"{getattr(array, 'shape', '')}; expected an array with {rows} rows"
            )
        if array.shape[0] != rows:
            raise BackendFault(
                f"model '{model_name}': backend output '{name}' has {array.shape[0]} rows; "
                f"expected {rows}, one per input row of the batch"
            )


def as_serving_error(model_name: str, error: BaseException) -> ServingError:
    """The error a request gets for a failed call: its own when it is one, else a logged fault."""
    if isinstance(error, ModelAborted):
        logger.error("%s", error.message)
        return error
    if isinstance(error, ServingError):
        return error
    logger.error("model '%s': backend failed", model_name, exc_info=(type(error), error, error.__traceback__))
    return BackendFault(f"model '{model_name}': backend failed: {error_line(error)}")


def joined(model_name: str, parts: list[Arrays], request_rows: int, limit_rows: int) -> Arrays:
    """One request's outputs from the calls its rows ran in, in row order.

    A model whose output shape depends on the rows it is given (text padded to its longest
    row, say) can answer two calls with rows of different shapes; those cannot be one answer.
    """
    if len(parts) == 1:
        return parts[0]
    outputs = {}
    for name in parts[0]:
        arrays = [part[name] for part in parts]
        shapes = sorted({array.shape[1:] for array in arrays})
        if len(shapes) > 1:
            raise InvalidInput(
                f"model '{model_name}': output {name!r} came back with rows of shape "
                f"{' and '.join(map(str, shapes))} from the calls this request's {request_rows} rows "
                f"ran in (the model runs at most {limit_rows} rows at once, and a call that "
                "runs out of memory is split); an output whose shape depends on the rows it is "
                f"computed with cannot be joined: send at most {limit_rows} rows per request, "
                "or give the output a fixed shape"
            )
        outputs[name] = np.concatenate(arrays)
    return outputs


def whole_request(
    loop: asyncio.AbstractEventLoop,
    chunks: list[Chunk],
    limit: RowLimit,
    reports: Reports,
) -> asyncio.Future[Arrays]:
    """One future for the chunks of a request cut to the batch limit: their outputs joined in
    order, or the first failure; cancelling it, or a failure, cancels the chunks not run.
    The batch limit named by a refusal to join them is the one of the moment they are joined."""
    whole: asyncio.Future[Arrays] = loop.create_future()
    pending = [len(chunks)]

    def on_chunk_done(future: asyncio.Future[Arrays]) -> None:
        if whole.done():
            return
        if future.cancelled():
            whole.cancel()
            return
        error = future.exception()
        if error is not None:
            whole.set_exception(error)
            return
        pending[0] -= 1
        if pending[0] == 0:
            try:
                outputs = joined(
                    reports.model_name,
                    [chunk.future.result() for chunk in chunks],
                    chunks[0].request_rows,
                    limit.rows,
                )
            except InvalidInput as refusal:
                whole.set_exception(refusal)
                return
            whole.set_result(outputs)
            reports.answered(chunks)

    def on_whole_done(_whole: asyncio.Future[Arrays]) -> None:
        for chunk in chunks:
            chunk.future.cancel()

    for chunk in chunks:
        chunk.future.add_done_callback(on_chunk_done)
    whole.add_done_callback(on_whole_done)
    return whole
