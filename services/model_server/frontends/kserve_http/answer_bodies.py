"""KServe v2 inference answers over HTTP: an answer's tensors written as JSON or as binary tensor
data.

An answer's outputs are JSON ``data``, unless the request asks for binary: ``"binary_data": true``
among an output's parameters, or ``"binary_data_output": true`` among the request's, for every
output not named with ``"binary_data": false`` (``bodies.OutputFormat``). Binary outputs follow the
JSON in the order of the outputs, each as the gRPC front end's raw contents (a BYTES element is a
4-byte little-endian length and its bytes), and their size is the output's ``binary_data_size``. An
output written into the client's shared-memory region is answered with its region's parameters, the
byte size it took, and no data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from udfserve import kserve_tensors as codec
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.core.request_lifecycle import InferenceRequest
from udfserve.services.model_server.frontends.kserve.answers import (
    NativeAnswer,
    RequestHead,
    TensorAnswer,
    TensorAnswers,
)
from udfserve.services.model_server.frontends.kserve.shared_memory_tensors import written_parameters
from udfserve.services.model_server.frontends.kserve.system_shared_memory import SystemSharedMemory
from udfserve.services.model_server.frontends.kserve_http.bodies import (
    BINARY_DATA,
    BINARY_DATA_SIZE,
    OutputFormat,
    model_text,
)


class HttpAnswers(TensorAnswers):
    """The answer of one HTTP request: its tensors (``TensorAnswers``), with the text of the BYTES
    outputs answered in JSON read here (``texts_of``), before the request counts as answered: JSON
    carries only text, so an output that is not UTF-8 refuses the request (INVALID_ARGUMENT)."""

    def __init__(self, form: OutputFormat, regions: SystemSharedMemory | None = None) -> None:
        super().__init__(regions)
        self.form = form
        self.texts: dict[str, list[str]] = {}

    def answer(
        self, request: InferenceRequest[RequestHead, NativeAnswer], outputs: dict[str, np.ndarray]
    ) -> NativeAnswer:
        answer = super().answer(request, outputs)
        assert isinstance(answer, TensorAnswer)
        self.texts = texts_of(answer, self.form)
        return answer


def texts_of(answer: TensorAnswer, form: OutputFormat) -> dict[str, list[str]]:
    """The elements of each BYTES output answered in JSON, as text; ``InvalidInput`` for one that
    is not UTF-8, naming the output and how to ask for it instead."""
    texts = {}
    for name, datatype, shape, raw in answer.tensors:
        if datatype != "BYTES" or form.binary(name) or name in answer.shared:
            continue
        elements = codec.deserialize_bytes(bytes(raw), math.prod(shape), name)
        try:
            texts[name] = [element.decode("utf-8") for element in elements]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"{model_text(answer.model_name)}: output {name!r} holds bytes that are not UTF-8 text, "
                f"which JSON cannot carry; expected it asked for as binary data (its parameter "
                f"{BINARY_DATA}: true)"
            ) from None
    return texts


def answer_body(
    answer: TensorAnswer, form: OutputFormat, texts: Mapping[str, list[str]]
) -> tuple[bytes, int | None]:
    """The body of an answer, and the length of its JSON when binary data follows it (the value
    of ``Inference-Header-Content-Length``), else None."""
    outputs = []
    binary: list[Any] = []
    for name, datatype, shape, raw in answer.tensors:
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        written = answer.shared.get(name)
        if written is not None:  # in the client's region: said where, and its size
            tensor["parameters"] = written_parameters(written)
        elif form.binary(name):
            data = raw if isinstance(raw, bytes) else raw.data.cast("B")
            tensor["parameters"] = {BINARY_DATA_SIZE: len(data)}
            binary.append(data)
        elif datatype == "BYTES":
            tensor["data"] = texts[name]
        else:
            values = (
                raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, codec.NUMPY_DTYPE_OF[datatype])
            )
            tensor["data"] = values.reshape(-1).tolist()
        outputs.append(tensor)
    head: dict[str, Any] = {"model_name": answer.model_name, "model_version": answer.model_version}
    if answer.id:
        head["id"] = answer.id
    head["outputs"] = outputs
    text = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if not binary:
        return text, None
    return b"".join([text, *binary]), len(text)
