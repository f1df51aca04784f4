"""An open, idle Predict stream, for tests that need a draining server to stay up."""

from __future__ import annotations

import threading

import grpc

from udfserve.protocol import inference_pb2_grpc as pb_grpc


class IdleStream:
    """An open, idle Predict stream: a draining server keeps serving (health, statistics,
    /metrics) until its open streams end or its grace period runs out, however fast it answered
    the requests it had accepted, so a test can look at it while it drains."""

    def __init__(self, target: str) -> None:
        self._done = threading.Event()
        self._channel = grpc.insecure_channel(target)
        requests = iter(lambda: self._done.wait() and None, None)  # yields nothing, ends when done
        self._call = pb_grpc.InferenceStub(self._channel).Predict(requests)
        self._reader = threading.Thread(target=lambda: list(self._call), daemon=True)
        self._reader.start()

    def close(self) -> None:
        self._done.set()
        self._reader.join(timeout=30)
        self._channel.close()
