"""KServe v2 messages (``tritonclient``'s generated code) to and from Arrow batches and tensor specs.

The client builds its ``ModelInferRequest`` from a record batch and reads a
``ModelInferResponse`` back into one, with the tensor rules of ``udfserve.kserve_tensors`` that
the server decodes with too. A peer's declared inputs and outputs come from its metadata or,
preferred, its Triton model configuration. ``tritonclient`` is imported here and not in the
shared layer: only a job that speaks ``protocol="kserve"`` loads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
from tritonclient.grpc import model_config_pb2, service_pb2

from udfserve.kserve_tensors import (
    FREE_DIM,
    KServeCodecError,
    TensorSpec,
    coerce,
    column_to_tensor,
    datatype_of,
    reshape_to_spec,
    tensor_from_contents,
    tensor_from_raw,
    tensor_to_arrow,
    tensor_to_raw,
)


def specs_from_metadata(
    metadata: service_pb2.ModelMetadataResponse,
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs and outputs of a batching model's metadata, the leading batch dimension removed.

    Every model a Spark UDF calls takes rows, so its first dimension must be the free batch
    dimension (``-1``); a model without one cannot be fed a batch of rows and is refused.
    """

    def per_row(
        tensors: Sequence[service_pb2.ModelMetadataResponse.TensorMetadata],
    ) -> tuple[TensorSpec, ...]:
        specs = []
        for tensor in tensors:
            shape = tuple(int(dim) for dim in tensor.shape)
            if not shape or shape[0] != FREE_DIM:
                raise KServeCodecError(
                    f"model {metadata.name!r}: tensor {tensor.name!r} has shape {list(shape)}; expected a "
                    "leading batch dimension of -1 (a model that batches rows)"
                )
            specs.append(TensorSpec(tensor.name, tensor.datatype, shape[1:]))
        return tuple(specs)

    return per_row(metadata.inputs), per_row(metadata.outputs)


def specs_from_config(
    config: model_config_pb2.ModelConfig,
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs and outputs of a Triton model configuration (the ``model_configuration`` extension).

    Preferred over the metadata when the peer offers it: an input keeps its ``dims`` (the shape
    the server checks on the wire), an output takes its ``reshape`` when it has one, so a
    per-row scalar that Triton writes as ``dims: [1]`` reshaped to ``[]`` comes back as a
    primitive column, as the Arrow protocol answers it.
    """
    if config.max_batch_size <= 0:
        raise KServeCodecError(
            f"model {config.name!r}: max_batch_size is {config.max_batch_size}; expected a model that "
            "batches rows (max_batch_size >= 1)"
        )

    def datatype(value: int) -> str:
        return model_config_pb2.DataType.Name(value).removeprefix("TYPE_").replace("STRING", "BYTES")

    inputs = tuple(TensorSpec(t.name, datatype(t.data_type), tuple(t.dims)) for t in config.input)
    outputs = tuple(
        TensorSpec(
            t.name,
            datatype(t.data_type),
            tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims),
        )
        for t in config.output
    )
    return inputs, outputs


def arrow_batch_to_infer_request(
    batch: pa.RecordBatch,
    model: str,
    version: int | str = "",
    request_id: str = "",
    *,
    input_specs: Sequence[TensorSpec] | None = None,
) -> service_pb2.ModelInferRequest:
    """One ``ModelInferRequest`` carrying every column of ``batch`` as a raw input tensor.

    With ``input_specs`` (from ``specs_from_metadata``) the batch must hold exactly those
    inputs; each is reshaped and coerced to its declared shape and datatype, which a real
    Triton requires (it refuses FP64 for an FP32 input). Without them the columns travel as
    they are.
    """
    names = batch.schema.names
    if input_specs is not None:
        expected = [spec.name for spec in input_specs]
        if sorted(names) != sorted(expected) or len(set(names)) != len(names):
            raise KServeCodecError(
                f"model {model!r}: expected exactly the input columns {expected}, received {names}"
            )
        specs: Mapping[str, TensorSpec | None] = {spec.name: spec for spec in input_specs}
    else:
        specs = dict.fromkeys(names)
    request = service_pb2.ModelInferRequest(model_name=model, model_version=str(version or ""), id=request_id)
    for index, name in enumerate(names):
        what = f"model {model!r}: column {name!r}"
        array = column_to_tensor(batch.column(index), what, specs[name])
        request.inputs.add(name=name, datatype=datatype_of(array.dtype, what), shape=array.shape)
        request.raw_input_contents.append(tensor_to_raw(array))
    return request


def response_tensors(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    """Every output of a response as an array, from raw or typed contents."""
    raw = response.raw_output_contents
    if raw and len(raw) != len(response.outputs):
        raise KServeCodecError(
            f"model {response.model_name!r}: the response has {len(response.outputs)} outputs but "
            f"{len(raw)} raw_output_contents; expected one per output"
        )
    tensors = {}
    for index, tensor in enumerate(response.outputs):
        what = f"model {response.model_name!r}: output {tensor.name!r}"
        if raw:
            tensors[tensor.name] = tensor_from_raw(raw[index], tensor.datatype, tensor.shape, what)
        else:
            tensors[tensor.name] = tensor_from_contents(tensor.contents, tensor.datatype, tensor.shape, what)
    return tensors


def infer_response_to_arrow(
    response: service_pb2.ModelInferResponse, output_specs: Sequence[TensorSpec]
) -> pa.RecordBatch:
    """The outputs named by ``output_specs``, in that order, as one record batch.

    A per-row scalar (shape ``()``, also when the peer sends it as ``[rows, 1]``) becomes a
    primitive column, a vector a ``fixed_size_list`` and a higher-rank tensor nested
    ``fixed_size_list`` columns: the same columns the Arrow protocol answers with.
    """
    tensors = response_tensors(response)
    columns, rows, first = [], None, ""
    for spec in output_specs:
        what = f"model {response.model_name!r}: output {spec.name!r}"
        if spec.name not in tensors:
            raise KServeCodecError(
                f"{what}: missing from the response; expected outputs {[s.name for s in output_specs]}, "
                f"received {sorted(tensors)}"
            )
        array = tensors[spec.name]
        if array.ndim == 0:
            raise KServeCodecError(f"{what}: expected a batch dimension, received a scalar tensor")
        array = coerce(reshape_to_spec(array, spec, what), spec.datatype, what)
        if rows is None:
            rows, first = array.shape[0], spec.name
        elif array.shape[0] != rows:
            raise KServeCodecError(
                f"{what}: has {array.shape[0]} rows but output {first!r} has {rows}; expected one row "
                "per input row in every output"
            )
        columns.append(tensor_to_arrow(array))
    return pa.RecordBatch.from_arrays(columns, names=[spec.name for spec in output_specs])
