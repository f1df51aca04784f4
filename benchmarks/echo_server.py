"""A bare gRPC server of the same ``Inference`` service that echoes each request's bytes back.

It decodes nothing, converts nothing and runs no model: what it reaches is the ceiling of
Python gRPC on this machine, so the transport comparison can tell the cost of the protocol
from the cost of the model server's own request path. Run as a child process:

    python -m benchmarks.echo_server --socket PATH --ready-file FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc


class EchoServicer(pb_grpc.InferenceServicer):
    async def Predict(
        self, request_iterator: AsyncIterator[pb.PredictRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PredictResponse]:
        async for request in request_iterator:
            yield pb.PredictResponse(batch_id=request.batch_id, arrow_ipc=request.arrow_ipc)


async def serve(socket_path: Path, ready_file: Path, max_message_bytes: int) -> None:
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    server = grpc.aio.server(options=options)
    pb_grpc.add_InferenceServicer_to_server(EchoServicer(), server)
    server.add_insecure_port(f"unix:{socket_path}")
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    addresses = {"pid": os.getpid(), "unix_socket": str(socket_path), "tcp_address": f"127.0.0.1:{port}"}
    ready_file.write_text(json.dumps(addresses), encoding="utf-8")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=1.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Echo gRPC server for the transport benchmark.")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--max-message-bytes", type=int, default=256 << 20)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.socket, args.ready_file, args.max_message_bytes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
