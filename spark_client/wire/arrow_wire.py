"""udfserve's own protocol under ``PredictStream``: one bidirectional ``Predict`` stream of Arrow IPC
payloads, inline or, for a server on this node, in shared-memory files."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import ArrowPayloadError, decode_batch, encode_batch
from udfserve.spark_client.common.task_config import TaskConfig
from udfserve.spark_client.wire.credentials import CallMetadata
from udfserve.spark_client.wire.shared_memory import SharedMemoryPayloads
from udfserve.spark_client.wire.transport import PredictStream
from udfserve.spark_client.wire.wire import END, Reply, StreamBroken

logger = logging.getLogger(__name__)

_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class ArrowWire:
    """udfserve's own protocol: one bidirectional ``Predict`` stream of Arrow IPC payloads, inline
    or, given ``payloads``, in the node's shared memory (``SharedMemoryPayloads``)."""

    def __init__(
        self,
        channel: grpc.Channel,
        target: str,
        model: str,
        config: TaskConfig,
        metadata: CallMetadata = (),
        payloads: SharedMemoryPayloads | None = None,
    ) -> None:
        self._stub = pb_grpc.InferenceStub(channel)
        self._target = target
        self._model = model
        self._version = config.model_version
        self._end_timeout_s = config.connect_timeout_s
        self._metadata = metadata
        self._payloads = payloads
        self._outbox: queue.Queue[pb.PredictRequest | None] = queue.Queue()
        self._events: queue.Queue[object] | None = None
        self._call: Any = None

    def open(self, events: queue.Queue[object]) -> None:
        self._events = events
        self._call = self._stub.Predict(_drain(self._outbox), metadata=self._metadata)
        threading.Thread(target=self._read_responses, args=(self._call, events), daemon=True).start()

    def send(self, batch_id: int, batch: pa.RecordBatch) -> bool:
        request = pb.PredictRequest(model=self._model, version=self._version, batch_id=batch_id)
        regions = self._payloads.place(batch_id, batch) if self._payloads is not None else None
        if regions is None:
            request.arrow_ipc = encode_batch(batch)
        else:
            request.input_region.CopyFrom(regions[0])
            request.output_region.CopyFrom(regions[1])
        self._outbox.put(request)
        return regions is not None

    def finish(self) -> bool:
        """Half-close, then let the server close the stream."""
        self._outbox.put(None)
        assert self._events is not None
        try:
            event = self._events.get(timeout=self._end_timeout_s)
        except queue.Empty:
            return False
        finally:
            self._close_payloads()
        return event is END

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._outbox.put(None)
        self._close_payloads()

    def _close_payloads(self) -> None:
        if self._payloads is not None:
            self._payloads.close()

    def _read_responses(self, call: Iterator[pb.PredictResponse], events: queue.Queue[object]) -> None:
        """Decode each answer on this thread, so the task's thread only pairs and yields them."""
        try:
            for response in call:
                events.put(self._reply(response))
        except grpc.RpcError as exc:
            events.put(StreamBroken(exc.code(), exc.details() or ""))
        except Exception as exc:  # the task's thread must hear of it, not wait out its deadline
            failure = f"reading the answers failed: {type(exc).__name__}: {exc}"
            events.put(StreamBroken(grpc.StatusCode.UNKNOWN, failure))
        else:
            events.put(END)

    def _reply(self, response: pb.PredictResponse) -> Reply:
        payloads = self._payloads
        # Only a batch this stream put in shared memory can be refused for it: anything else so
        # flagged is an error answer like any other, never a reason to resend without end.
        if response.shared_memory_refused and payloads is not None and payloads.release(response.batch_id):
            if payloads.placing:
                payloads.placing = False
                _refused_shared_memory[self._target] = time.monotonic()
                logger.warning(
                    "%s cannot use this node's shared memory (%s); batches to it travel inline",
                    self._target,
                    response.error.message,
                )
            return Reply(response.batch_id, resend=True)
        if payloads is None:
            return _reply(response)
        if response.output_region_bytes:
            try:
                result = payloads.answer(response.batch_id, response.output_region_bytes)
            except ValueError as exc:  # ArrowPayloadError, or a size the file cannot hold
                return Reply(response.batch_id, unreadable=str(exc))
            return Reply(response.batch_id, result=result, version=response.model_version)
        payloads.release(response.batch_id)
        reply = _reply(response)
        if reply.result is not None:
            payloads.learn_answer_size(reply.result.num_rows, len(response.arrow_ipc))
        return reply


def _drain(outbox: queue.Queue[pb.PredictRequest | None]) -> Iterator[pb.PredictRequest]:
    """The request side of the call: what the client puts in ``outbox``, until None."""
    while True:
        request = outbox.get()
        if request is None:
            return
        yield request


def _reply(response: pb.PredictResponse) -> Reply:
    if response.HasField("error"):
        code = _CODES_BY_NUMBER.get(response.error.code, grpc.StatusCode.UNKNOWN)
        return Reply(response.batch_id, code=code, message=response.error.message)
    try:
        result = decode_batch(response.arrow_ipc, "PredictResponse.arrow_ipc")
        return Reply(response.batch_id, result=result, version=response.model_version)
    except ArrowPayloadError as exc:
        return Reply(response.batch_id, unreadable=str(exc))


def arrow_stream(
    channel: grpc.Channel, target: str, model: str, config: TaskConfig, metadata: CallMetadata = ()
) -> PredictStream:
    """A ``PredictStream`` over udfserve's Arrow protocol, with its payloads in shared memory when
    the server is on this node (a unix socket), the config allows it and the server has not
    refused it lately."""
    payloads = None
    if _may_use_shared_memory(target, config):
        payloads = SharedMemoryPayloads(
            Path(config.shared_memory_dir), config.max_in_flight, config.shared_memory_group_access
        )
    wire = ArrowWire(channel, target, model, config, metadata, payloads)
    return PredictStream(wire, target, model, config)


SHARED_MEMORY_RETRY_S = 300.0
"""After a server refused this process's shared memory, how long its streams go inline before
trying again (the server may be restarted with another --shared-memory-dir)."""
_refused_shared_memory: dict[str, float] = {}


def _may_use_shared_memory(target: str, config: TaskConfig) -> bool:
    if not config.shared_memory or not target.startswith("unix:"):
        return False
    refused_at = _refused_shared_memory.get(target)
    if refused_at is not None and time.monotonic() - refused_at < SHARED_MEMORY_RETRY_S:
        return False
    return Path(config.shared_memory_dir).is_dir()
