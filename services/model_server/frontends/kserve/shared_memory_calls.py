"""The system shared-memory calls of the KServe v2 protocol (register, status, unregister), as
the servicer answers them on every front end (the python and native gRPC ones, HTTP); and the
words of what is not served.

The CUDA shared-memory calls stay refused: a CUDA region is device memory that the client's
process exported with ``cudaIpcGetMemHandle``, which only a server on the same GPU can open, and
this server copies every request it reads (see ``system_shared_memory``); serving them needs a
GPU to design and test it on. Unregister is the exception: no CUDA region is ever registered
here, so forgetting one, or all, succeeds with nothing to do, as Triton answers for a region it
does not hold; clients that start by clearing every region (Triton's
``reuse_infer_objects_client.py``) then go on with system shared memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc

from udfserve.protocol.kserve import grpc_service_pb2 as kpb
from udfserve.runtime.errors import ServingError
from udfserve.services.model_server.frontends.kserve.system_shared_memory import SystemSharedMemory, client_of

_R = TypeVar("_R")

CUDA_SHARED_MEMORY_REFUSED = (
    "CUDA shared memory is not served by this server: it needs the client and the server on one "
    "GPU, and udfserve reads every request by copy; expected tensors in the request, or in system "
    "shared memory"
)
SYSTEM_SHARED_MEMORY_OFF = (
    "system shared memory is off on this server (--shared-memory-dir off); expected tensors in the request"
)


class SharedMemoryNotServed(ServingError):
    """A call or request naming shared memory where this front end does not serve it."""

    code = grpc.StatusCode.UNIMPLEMENTED


def register(
    regions: SystemSharedMemory | None, request: kpb.SystemSharedMemoryRegisterRequest, client: str
) -> kpb.SystemSharedMemoryRegisterResponse:
    _served(regions).register(request.name, request.key, request.offset, request.byte_size, client)
    return kpb.SystemSharedMemoryRegisterResponse()


def status(
    regions: SystemSharedMemory | None, request: kpb.SystemSharedMemoryStatusRequest
) -> kpb.SystemSharedMemoryStatusResponse:
    response = kpb.SystemSharedMemoryStatusResponse()
    for region in _served(regions).status(request.name):
        response.regions[region.name].CopyFrom(
            kpb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
            )
        )
    return response


def unregister(
    regions: SystemSharedMemory | None, request: kpb.SystemSharedMemoryUnregisterRequest
) -> kpb.SystemSharedMemoryUnregisterResponse:
    _served(regions).unregister(request.name)
    return kpb.SystemSharedMemoryUnregisterResponse()


def _served(regions: SystemSharedMemory | None) -> SystemSharedMemory:
    if regions is None:
        raise SharedMemoryNotServed(SYSTEM_SHARED_MEMORY_OFF)
    return regions


async def _answered(context: grpc.aio.ServicerContext, call: Callable[[], _R]) -> _R:
    """``call``'s answer, or the call ended with the status of its ``ServingError``."""
    try:
        return call()
    except ServingError as exc:
        await context.abort(exc.code, exc.message)
        raise AssertionError("context.abort returned") from None  # it raises


async def _cuda_refused(context: grpc.aio.ServicerContext) -> NoReturn:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, CUDA_SHARED_MEMORY_REFUSED)
    raise AssertionError("context.abort returned")  # it raises


class SharedMemoryCalls:
    """The shared-memory methods of ``KServeServicer`` (``GRPCInferenceService``'s six), over
    ``shared_memory``: the server's regions, None where system shared memory is off."""

    shared_memory: SystemSharedMemory | None

    async def SystemSharedMemoryRegister(
        self, request: kpb.SystemSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> kpb.SystemSharedMemoryRegisterResponse:
        """Registered for the whole server; bounded per client by the peer's address."""
        return await _answered(
            context, lambda: register(self.shared_memory, request, client_of(context.peer()))
        )

    async def SystemSharedMemoryStatus(
        self, request: kpb.SystemSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> kpb.SystemSharedMemoryStatusResponse:
        return await _answered(context, lambda: status(self.shared_memory, request))

    async def SystemSharedMemoryUnregister(
        self, request: kpb.SystemSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> kpb.SystemSharedMemoryUnregisterResponse:
        return await _answered(context, lambda: unregister(self.shared_memory, request))

    async def CudaSharedMemoryRegister(self, request: object, context: grpc.aio.ServicerContext) -> NoReturn:
        await _cuda_refused(context)

    async def CudaSharedMemoryStatus(self, request: object, context: grpc.aio.ServicerContext) -> NoReturn:
        await _cuda_refused(context)

    async def CudaSharedMemoryUnregister(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> kpb.CudaSharedMemoryUnregisterResponse:
        """Nothing to forget: no CUDA region is ever registered here (the module says why)."""
        return kpb.CudaSharedMemoryUnregisterResponse()
