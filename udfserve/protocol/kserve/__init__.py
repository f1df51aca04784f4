"""KServe v2 (NVIDIA Triton's) gRPC protocol, generated from ``protos/udfserve/protocol/kserve/``.

The server's KServe front ends speak it through these modules, so a server needs no
``tritonclient``. The files are registered under the names NVIDIA gives them
(``grpc_service.proto``, ``model_config.proto``, package ``inference``), with the same serialized
descriptors as ``tritonclient.grpc.service_pb2`` and ``model_config_pb2``: protobuf's descriptor
pool takes a file a second time only when both copies are identical, and a process may import
both (a test's server beside its client). ``scripts/generate_protos.py`` regenerates them.
"""
