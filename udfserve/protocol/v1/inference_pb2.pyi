from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
    MODEL_STATE_UNLOADED: _ClassVar[ModelState]
    MODEL_STATE_DRAINING: _ClassVar[ModelState]

class VersionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERSION_STATE_UNSPECIFIED: _ClassVar[VersionState]
    VERSION_STATE_READY: _ClassVar[VersionState]
    VERSION_STATE_LOADING: _ClassVar[VersionState]
    VERSION_STATE_UNLOADING: _ClassVar[VersionState]
    VERSION_STATE_UNAVAILABLE: _ClassVar[VersionState]
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_FAILED: ModelState
MODEL_STATE_UNLOADED: ModelState
MODEL_STATE_DRAINING: ModelState
VERSION_STATE_UNSPECIFIED: VersionState
VERSION_STATE_READY: VersionState
VERSION_STATE_LOADING: VersionState
VERSION_STATE_UNLOADING: VersionState
VERSION_STATE_UNAVAILABLE: VersionState

class PredictRequest(_message.Message):
    __slots__ = ("model", "version", "batch_id", "arrow_ipc", "input_region", "output_region")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    INPUT_REGION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_REGION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    batch_id: int
    arrow_ipc: bytes
    input_region: SharedMemoryRegion
    output_region: SharedMemoryRegion
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., batch_id: _Optional[int] = ..., arrow_ipc: _Optional[bytes] = ..., input_region: _Optional[_Union[SharedMemoryRegion, _Mapping]] = ..., output_region: _Optional[_Union[SharedMemoryRegion, _Mapping]] = ...) -> None: ...

class SharedMemoryRegion(_message.Message):
    __slots__ = ("path", "offset", "size")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    size: int
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("batch_id", "arrow_ipc", "error", "model_version", "output_region_bytes", "shared_memory_refused")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_REGION_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_REFUSED_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    arrow_ipc: bytes
    error: Error
    model_version: int
    output_region_bytes: int
    shared_memory_refused: bool
    def __init__(self, batch_id: _Optional[int] = ..., arrow_ipc: _Optional[bytes] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., model_version: _Optional[int] = ..., output_region_bytes: _Optional[int] = ..., shared_memory_refused: bool = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelMetadata]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelMetadata, _Mapping]]] = ...) -> None: ...

class ModelMetadataRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelMetadata(_message.Message):
    __slots__ = ("name", "version", "platform", "state", "error", "inputs", "outputs", "max_batch_size", "max_queue_delay_s", "device", "available_versions", "served_versions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SERVED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    platform: str
    state: ModelState
    error: str
    inputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    max_batch_size: int
    max_queue_delay_s: float
    device: str
    available_versions: _containers.RepeatedScalarFieldContainer[int]
    served_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., platform: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., error: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., max_batch_size: _Optional[int] = ..., max_queue_delay_s: _Optional[float] = ..., device: _Optional[str] = ..., available_versions: _Optional[_Iterable[int]] = ..., served_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("model", "config_json", "reload")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RELOAD_FIELD_NUMBER: _ClassVar[int]
    model: str
    config_json: str
    reload: bool
    def __init__(self, model: _Optional[str] = ..., config_json: _Optional[str] = ..., reload: bool = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("served_versions",)
    SERVED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    served_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, served_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RepositoryIndexRequest(_message.Message):
    __slots__ = ("ready_only",)
    READY_ONLY_FIELD_NUMBER: _ClassVar[int]
    ready_only: bool
    def __init__(self, ready_only: bool = ...) -> None: ...

class RepositoryIndexResponse(_message.Message):
    __slots__ = ("models",)
    class Entry(_message.Message):
        __slots__ = ("model", "version", "state", "reason")
        MODEL_FIELD_NUMBER: _ClassVar[int]
        VERSION_FIELD_NUMBER: _ClassVar[int]
        STATE_FIELD_NUMBER: _ClassVar[int]
        REASON_FIELD_NUMBER: _ClassVar[int]
        model: str
        version: int
        state: VersionState
        reason: str
        def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[VersionState, str]] = ..., reason: _Optional[str] = ...) -> None: ...
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[RepositoryIndexResponse.Entry]
    def __init__(self, models: _Optional[_Iterable[_Union[RepositoryIndexResponse.Entry, _Mapping]]] = ...) -> None: ...
