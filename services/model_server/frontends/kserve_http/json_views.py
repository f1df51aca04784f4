"""The KServe v2 answers as Triton writes them over HTTP, and the HTTP status of each gRPC status.

The HTTP routes ask the same ``KServeServicer`` as the gRPC front end and write its protobuf
answers as JSON the way Triton does: field names as in the ``.proto`` files, fields at their
default value included (perf_analyzer reads ``max_batch_size`` of 0 too), 64-bit integers as JSON
numbers (protobuf's own JSON mapping writes them as strings), enums by name (``TYPE_FP32``).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

HTTP_STATUS_OF: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    # Triton's own map (its HTTP server's HttpCodeFromError), for the codes Triton has
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNKNOWN: 400,
    grpc.StatusCode.ALREADY_EXISTS: 400,
    grpc.StatusCode.CANCELLED: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    # the others as Google's HTTP mapping of gRPC codes has them
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""The HTTP status answering a gRPC status: Triton's for the codes its server knows (a full queue is
UNAVAILABLE there, so 503, "Exceeds maximum queue size"), Google's mapping for the rest (a device
out of memory on a single row, RESOURCE_EXHAUSTED, is 429)."""

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def http_status(code: grpc.StatusCode) -> int:
    return HTTP_STATUS_OF.get(code, 500)


def as_json(message: Message) -> dict[str, Any]:
    """``message`` as Triton writes it in JSON (see the module's docstring)."""
    value = json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    _int64_as_numbers(value, message.DESCRIPTOR)
    return value


def _int64_as_numbers(value: dict[str, Any], descriptor: Descriptor) -> None:
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.type in _INT64_TYPES:
            value[key] = [int(x) for x in item] if field.is_repeated else int(item)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            message_type = field.message_type
            if message_type.GetOptions().map_entry:
                value_field = message_type.fields_by_name["value"]
                if value_field.type in _INT64_TYPES:
                    value[key] = {k: int(v) for k, v in item.items()}
                elif value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    for element in item.values():
                        _int64_as_numbers(element, value_field.message_type)
            elif field.is_repeated:
                for element in item:
                    _int64_as_numbers(element, message_type)
            else:
                _int64_as_numbers(item, message_type)
