"""The runner: one backend call per batch, in the executor, its outputs split back by row counts.

The common case, one call within the batch limit that succeeds, is answered from the call's
completion callback: no task, no await. A batch that needs more (a failed call, or chunks queued
before the limit dropped) continues in a task (``recovery``). Every call's outputs are checked
(``answers.check_outputs``) in the executor's thread, before the event loop sees them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from udfserve.runtime.call_bound import WATCH
from udfserve.runtime.errors import BackendFault, ModelCallTimeout, model_failure, raise_if_stopping
from udfserve.services.model_server.core.batching.answers import check_outputs, resolve, set_exception
from udfserve.services.model_server.core.batching.observers import Reports
from udfserve.services.model_server.core.batching.queue import Arrays, Chunk
from udfserve.services.model_server.core.batching.recovery import CallResult, Recovery
from udfserve.services.model_server.core.batching.row_limit import RowLimit
from udfserve.services.model_server.errors import ModelUnavailable
from udfserve.services.model_server.observability import tracing as server_tracing

if TYPE_CHECKING:
    from udfserve.services.model_server.observability.spans import BatchTrace, ServerTracing

logger = logging.getLogger(__name__)

PredictFn = Callable[[Arrays], Mapping[str, np.ndarray]]


@dataclass(eq=False)
class Batch:
    """Chunks taken from the queue and run together; ``call`` or ``task`` is what runs them."""

    chunks: list[Chunk]
    rows: int
    inputs: Arrays
    task: asyncio.Task[None] | None = None
    trace: BatchTrace | None = None
    """Its span, when tracing is on and it merged a traced request."""


def _batch_trace(tracing: ServerTracing, model: str, chunks: list[Chunk], rows: int) -> BatchTrace | None:
    """The batch's span when it merged a traced request (each request once), else None."""
    traces = list({id(chunk.trace): chunk.trace for chunk in chunks if chunk.trace is not None}.values())
    if not traces:
        return None
    return tracing.batch(model, traces, rows, len({chunk.request for chunk in chunks}))


def _released(inputs: Arrays) -> Mapping[str, np.ndarray]:
    raise ModelUnavailable("the model was released; retry on a version that serves")


class BatchRunner:
    """Runs the batches the dispatcher starts; ``running`` holds them until they are answered,
    when ``on_finished`` is called (the batcher dispatches again)."""

    def __init__(
        self,
        model_name: str,
        predict: PredictFn,
        executor: concurrent.futures.Executor,
        limit: RowLimit,
        reports: Reports,
        running: set[Batch],
        on_finished: Callable[[Batch], None],
        *,
        call_bound_s: float = 0.0,
        on_stuck: Callable[[str], None] | None = None,
    ) -> None:
        self.model_name = model_name
        self._call_bound_s = call_bound_s
        self._on_stuck = on_stuck
        self._predict = predict
        self._executor = executor
        self._limit = limit
        self._reports = reports
        self._running = running
        self._on_finished = on_finished
        self._recovery = Recovery(model_name, self._call, limit, reports)
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answer on ``loop`` (the batcher's, once started)."""
        self._loop = loop

    def start(self, chunks: list[Chunk]) -> None:
        """Start one batch: one call in the executor, or a task when it needs several."""
        loop = self._loop
        assert loop is not None
        started_s = loop.time()
        reports = self._reports
        for chunk in chunks:
            waited_s = started_s - chunk.enqueued_at_s
            reports.queue_wait(waited_s)
            if chunk.on_start is not None:
                reports.application_wait(chunk.on_start, waited_s)
        if len(chunks) == 1:
            inputs = chunks[0].inputs
        else:
            inputs = {name: np.concatenate([c.inputs[name] for c in chunks]) for name in chunks[0].inputs}
        rows = sum(chunk.rows for chunk in chunks)
        batch = Batch(chunks, rows, inputs)
        if server_tracing.ACTIVE is not None:
            batch.trace = _batch_trace(server_tracing.ACTIVE, self.model_name, chunks, rows)
        self._running.add(batch)
        if rows > self._limit.rows:  # queued before the limit dropped: several calls
            batch.task = loop.create_task(self._run_batch(batch, None))
            return
        call = self._executor.submit(self._call_backend, inputs, rows)
        call.add_done_callback(functools.partial(self._call_finished, loop, batch))

    def _call_finished(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: Batch,
        call: concurrent.futures.Future[CallResult],
    ) -> None:
        """Runs in the executor's thread: hand the result to the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the answer
            loop.call_soon_threadsafe(self._on_call_done, batch, call)

    def _on_call_done(self, batch: Batch, call: concurrent.futures.Future[CallResult]) -> None:
        if batch not in self._running:
            return  # stopped after the grace period: its requests were answered already
        try:
            result = call.result()
        except BaseException as error:  # _call_backend never raises; the executor might
            result = CallResult(None, model_failure(error, self.model_name), 0.0)
        try:
            self._reports.batch(batch.rows, len(batch.chunks), result.seconds, result.error is None)
            if batch.trace is not None:
                batch.trace.device_call(result.seconds, result.error)
            if result.error is not None:
                assert self._loop is not None
                batch.task = self._loop.create_task(self._run_batch(batch, result))
                return
            self._answer(batch, result)
        except BaseException as error:
            # A fault of ours on the answer path (an observer, a slice): without this the batch
            # would stay running for good, its clients waiting and its slot never given back.
            raise_if_stopping(error)
            logger.exception("model '%s': answering a batch failed", self.model_name)
            fault = BackendFault(f"model '{self.model_name}': answering the batch failed; see the server log")
            for chunk in batch.chunks:
                set_exception(chunk.future, fault)
        self._finish(batch)

    def _answer(self, batch: Batch, result: CallResult) -> None:
        """Each chunk of a batch its own rows of the call's outputs."""
        self._limit.on_success(batch.rows)
        outputs = result.outputs
        assert outputs is not None
        reports = self._reports
        if len(batch.chunks) == 1:
            resolve(batch.chunks[0], outputs, result.seconds, reports)
            return
        start = 0
        for chunk in batch.chunks:
            stop = start + chunk.rows
            chunk_outputs = {name: array[start:stop] for name, array in outputs.items()}
            resolve(chunk, chunk_outputs, result.seconds, reports)
            start = stop

    async def _run_batch(self, batch: Batch, first: CallResult | None) -> None:
        """The batch in as many calls as it takes; ``first`` is its failed whole-batch call."""
        try:
            await self._recovery.run(batch.chunks, batch.inputs, batch.rows, first)
        except BaseException as failure:  # cancelled by a stop: answered by the stop, and goes on up
            raise_if_stopping(failure)
            logger.exception("model '%s': running a batch failed", self.model_name)
            error = BackendFault(f"model '{self.model_name}': running the batch failed; see the server log")
            for chunk in batch.chunks:
                set_exception(chunk.future, error)
        finally:
            self._finish(batch)

    def _finish(self, batch: Batch) -> None:
        if batch in self._running:
            self._running.discard(batch)
            if batch.trace is not None:
                batch.trace.end()
            self._on_finished(batch)

    async def _call(self, inputs: Arrays, rows: int, requests: int) -> CallResult:
        """One backend call in the executor, reported to the observer."""
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, self._call_backend, inputs, rows)
        self._reports.batch(rows, requests, result.seconds, result.error is None)
        return result

    def _call_backend(self, inputs: Arrays, rows: int) -> CallResult:
        """Runs in the executor; never raises, so the event loop sees one kind of answer. A panic
        of the model's native code (``PanicException``, no ``Exception``) fails the call as
        ``ModelAborted``: let through, it would reach the event loop as an error of the callback
        and leave the batch running for good, its clients unanswered and its slot taken."""
        started_s = time.perf_counter()
        with WATCH.bounded(self._call_bound_s, self._stuck) as call:
            try:
                outputs = dict(self._predict(inputs))
            except BaseException as error:
                seconds = time.perf_counter() - started_s
                if call.overran:  # stopped at its bound: whatever the framework raised for it
                    raise_if_stopping(error)
                    return CallResult(None, self._timed_out(rows), seconds)
                return CallResult(None, model_failure(error, self.model_name), seconds)
        try:
            check_outputs(self.model_name, outputs, rows)
        except BaseException as error:
            return CallResult(None, model_failure(error, self.model_name), time.perf_counter() - started_s)
        return CallResult(outputs, None, time.perf_counter() - started_s)

    def release_model(self) -> None:
        """Drop the predict (and with it the model): the batcher is stopped, no call comes."""
        self._predict = _released

    def _timed_out(self, rows: int) -> ModelCallTimeout:
        return ModelCallTimeout(
            f"model '{self.model_name}': the call of {rows} row(s) ran past the server's bound of "
            f"{self._call_bound_s:g} s on one model call and was stopped; expected a call within the bound "
            "(smaller batches, input the model handles in time, or a longer --model-call-timeout-s)"
        )

    def _stuck(self, reason: str) -> None:
        """From the watchdog's thread: a call past its bound that its backend could not stop."""
        loop, on_stuck = self._loop, self._on_stuck
        if loop is None or on_stuck is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is going
            loop.call_soon_threadsafe(on_stuck, reason)
