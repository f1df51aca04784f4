"""Settings that bound what one client can make the server hold: message sizes, bytes held per
stream and for unary calls, and calls at once. Each bound is checked before the bytes it bounds
are read, so that no client grows the process past them."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LimitSettings(BaseModel):
    """Bounds on messages, held requests and concurrent calls."""

    max_message_bytes: int = Field(
        default=64 << 20, ge=1 << 16, le=(1 << 31) - 1, description="largest gRPC message, both ways"
    )
    max_stream_held_requests: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="requests one stream (Arrow Predict, KServe ModelStreamInfer) holds read and not yet "
        "answered onto the wire, queued, answered or refused alike; at it the server stops reading "
        "the stream until the client takes answers",
    )
    max_stream_held_bytes: int = Field(
        default=32 << 20,
        ge=1 << 16,
        description="bytes of the request messages one stream holds read and not yet answered onto the "
        "wire; at it the server stops reading the stream (a stream holding nothing still reads "
        "one message up to --max-message-bytes)",
    )
    max_unary_held_bytes: int = Field(
        default=256 << 20,
        ge=1 << 16,
        description="bytes of unary KServe ModelInfer calls the server holds, read or being read, and not "
        "yet answered; a call is read once there is room for a message of --max-message-bytes "
        "and waits unread until then (one call is always read while none is held); the native KServe "
        "port has a budget of this size of its own, for all its calls",
    )
    trim_after_call_bytes: int = Field(
        default=16 << 20,
        ge=0,
        description="after a unary KServe ModelInfer call (any call on the native KServe port) of at "
        "least this many bytes is answered, hand the memory the process freed back to the system "
        "(glibc's malloc_trim, at most once a second); 0 never trims",
    )
    max_concurrent_calls: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description="gRPC calls (streams and unary calls, health checks included) the server handles "
        "at once; calls beyond are refused RESOURCE_EXHAUSTED before anything of them is read (some "
        "may first wait, unread, in gRPC's queue of calls not yet handed to the server); the native "
        "KServe port counts its own calls against a limit of this size",
    )
