"""What one client sending bad ids costs the other clients of a model: their rows per second.

One server of ``multi_io`` (an embedding table of 16 rows behind its ``category`` input). Eight
well-behaved Predict streams (one client process, each stream keeping ``IN_FLIGHT`` requests of
``ROWS`` valid rows in flight) run alone, then beside one attacker stream (a process of its own)
that keeps as many requests in flight whose ``category`` holds ids beyond the table (99, 1000,
INT32_MAX, INT32_MIN). The phases alternate ``--rounds`` times; the result is the good clients'
rows per second in each, and their ratio (with the attacker / alone), which is what the shared,
noisy machine lets one compare.

Once, the attacker's requests were merged with the good ones and failed every call they shared;
the batcher then ran each request of that call alone, and the good clients lost most of their
throughput. Now the ids are refused before merging (``udfserve.runtime.value_ranges``).

    python -m tests.fuzz.bad_neighbour                 # 3 rounds of 10 s per phase
    python -m tests.fuzz.bad_neighbour --seconds 3 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import sys
import time
from collections.abc import Sequence

import grpc
import numpy as np
import pyarrow as pa

from benchmarks.processes import Workspace
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import encode_batch

logger = logging.getLogger("bad_neighbour")

GOOD_STREAMS = 8
IN_FLIGHT = 4
ROWS = 64
BAD_IDS = (99, 1000, 2**31 - 1, -(2**31))


def _request(rows: int, categories: np.ndarray, batch_id: int) -> pb.PredictRequest:
    numeric = np.random.default_rng(batch_id).normal(size=(rows, 8)).astype(np.float32)
    batch = pa.record_batch(
        {
            "numeric": pa.FixedSizeListArray.from_arrays(pa.array(numeric.reshape(-1)), 8),
            "category": pa.array(categories.astype(np.int32)),
        }
    )
    return pb.PredictRequest(model="multi_io", batch_id=batch_id, arrow_ipc=encode_batch(batch))


def _requests(bad: bool) -> list[pb.PredictRequest]:
    requests = []
    for index in range(16):
        categories = np.arange(ROWS) % 16
        if bad:
            categories[index % ROWS] = BAD_IDS[index % len(BAD_IDS)]
        requests.append(_request(ROWS, categories, index))
    return requests


async def _stream(target: str, bad: bool, stop_at: float, counts: list[int]) -> None:
    """One Predict stream keeping ``IN_FLIGHT`` requests in flight until ``stop_at``; ``counts``
    gets [rows answered, requests refused]."""
    requests = _requests(bad)
    window = asyncio.Semaphore(IN_FLIGHT)

    async def sent():
        index = 0
        while time.monotonic() < stop_at:
            await window.acquire()
            request = requests[index % len(requests)]
            request.batch_id = index
            index += 1
            yield request

    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream(
            "/udfserve.v1.Inference/Predict",
            request_serializer=pb.PredictRequest.SerializeToString,
            response_deserializer=pb.PredictResponse.FromString,
        )(sent())
        async for response in call:
            window.release()
            if response.HasField("error"):
                counts[1] += 1
            elif time.monotonic() < stop_at:
                counts[0] += ROWS


async def _streams(target: str, streams: int, bad: bool, seconds: float) -> tuple[int, int]:
    stop_at = time.monotonic() + seconds
    counts = [[0, 0] for _ in range(streams)]
    await asyncio.gather(*(_stream(target, bad, stop_at, count) for count in counts))
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def _attacker(target: str, seconds: float) -> None:
    asyncio.run(_streams(target, 1, True, seconds))


def measure(target: str, seconds: float, with_attacker: bool) -> float:
    """The good streams' rows per second over ``seconds``, alone or beside the attacker."""
    attacker = None
    if with_attacker:
        attacker = multiprocessing.get_context("spawn").Process(target=_attacker, args=(target, seconds + 2))
        attacker.start()
        time.sleep(1.0)  # the attacker's stream is open and sending before the good ones count
    try:
        rows, refused = asyncio.run(_streams(target, GOOD_STREAMS, False, seconds))
    finally:
        if attacker is not None:
            attacker.join(timeout=seconds + 30)
    if refused:
        raise RuntimeError(f"{refused} good requests were refused")
    return rows / seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="alone/attacked phase pairs (default 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with Workspace(prefix="udfsbn-") as workspace:
        server = workspace.start_server(
            workspace.repository("bad-neighbour", {"multi_io": {}}), "bad-neighbour"
        )
        target = server.grpc_target()
        measure(target, 2.0, False)  # warm-up
        alone, attacked = [], []
        for round_number in range(args.rounds):
            alone.append(measure(target, args.seconds, False))
            attacked.append(measure(target, args.seconds, True))
            logger.info(
                "round %d: alone %.0f rows/s, with the attacker %.0f", round_number, alone[-1], attacked[-1]
            )
    ratio = sum(attacked) / sum(alone)
    print(f"| phase | rows/s of {GOOD_STREAMS} good streams (per round) |")
    print("|---|---|")
    print(f"| alone | {', '.join(f'{v:,.0f}' for v in alone)} |")
    print(f"| beside one stream of bad ids | {', '.join(f'{v:,.0f}' for v in attacked)} |")
    print(f"\nratio with the attacker / alone: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
