"""The gRPC wire contract (generated from ``protos/``) and its Arrow IPC payloads."""

from udfserve.protocol.v1 import inference_pb2, inference_pb2_grpc

__all__ = ["inference_pb2", "inference_pb2_grpc"]
