"""PyTorch backend: a ``torch.export`` program (``model.pt2``) or TorchScript (``model.pt``).

Never unpickles arbitrary code. ``model.pt2`` is checked as the zip and JSON it is before torch
reads it (``archive``: torch's own ``torch.export.load`` would unpickle, import and
evaluate what the file says), and after loading every call in its graph is checked again to be
an ATen or prims operator (ATen's file operators excepted). ``model.pt`` must be TorchScript,
loaded by ``torch.jit.load`` (compiled TorchScript, no Python) once its code is seen to name no
file operator (it runs at load, in ``__setstate__``); a file written by ``torch.save`` is refused
unread. Nothing here calls ``torch.load`` but with ``weights_only=True``.

Inputs and outputs come from the exported program (``specs``), or from config.yaml for
TorchScript, which records none. Every call runs under ``torch.inference_mode`` on the process's
device (``device``: ``cuda:0`` in a process pinned to a GPU, else the CPU). Inputs go in
without a copy on the CPU (DLPack views of the numpy arrays, read-only ones included), outputs
come back as numpy views of the result tensors; on a GPU each crosses the bus once. Torch's
errors become the runtime's (``errors``).
"""

from __future__ import annotations

import functools
import io
import logging
import operator
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from udfserve.runtime.backends.base import BackendModel
from udfserve.runtime.backends.pytorch.archive import (
    ALLOWED_HIGHER_ORDER,
    FILE_OPERATORS,
    ArchiveRefused,
    check_exported_program,
    check_torchscript,
)
from udfserve.runtime.backends.pytorch.device import placement
from udfserve.runtime.backends.pytorch.errors import call_error
from udfserve.runtime.backends.pytorch.specs import (
    SpecMismatch,
    agreed_inputs,
    agreed_outputs,
    program_specs,
    script_specs,
    torch_dtype,
)
from udfserve.runtime.backends.warmup import warm_up
from udfserve.runtime.errors import BackendFault, ModelLoadError, ServingError
from udfserve.runtime.model_source import ModelSource
from udfserve.runtime.tensor_spec import TensorSpec, numpy_dtype, zeros

logger = logging.getLogger(__name__)

PLATFORM = "pytorch"
EXPORT_PLATFORM = "pytorch_export"
SCRIPT_PLATFORM = "pytorch_libtorch"
"""Triton's name for TorchScript; KServe clients know it."""
EXPORT_FILE_NAME = "model.pt2"
SCRIPT_FILE_NAME = "model.pt"
ALLOWED_NAMESPACES = frozenset({"aten", "prims"})

Call = Callable[[list[torch.Tensor]], Any]


class PyTorchModel(BackendModel):
    """A loaded model. ``predict`` is blocking and safe to call from several threads."""

    def __init__(
        self,
        *,
        name: str,
        version: int,
        platform: str,
        artifact: Path,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        model_dtypes: Sequence[torch.dtype | None],
        output_names: Sequence[str],
        call: Call,
        device: torch.device,
        example_row_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        super().__init__(name=name, version=version, artifact=artifact, inputs=inputs, outputs=outputs)
        self.platform = platform
        self._model_dtypes = tuple(model_dtypes)
        """Per input, the dtype the model takes when config.yaml declares another (None: as given)."""
        self._output_names = tuple(output_names)
        """Per output of the model, in its order, the name it is served under."""
        self._output_dtypes = {spec.name: torch_dtype(spec.dtype) for spec in outputs}
        self._call = call
        self._device = device
        self.example_row_shapes = dict(example_row_shapes or {})
        """Per input, a per-row shape the model takes (from the program's example inputs): warm-up
        calls need one where the program constrains a free dimension (an even length, at least 4)."""

    def predict(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.require_inputs(inputs)
        rows = self.rows(inputs)
        try:
            with torch.inference_mode():
                tensors = [
                    _to_torch(inputs[spec.name], self._device, dtype)
                    for spec, dtype in zip(self.inputs, self._model_dtypes, strict=True)
                ]
                results = self._named(self._call(tensors))
                answer = {
                    spec.name: _to_numpy(results[spec.name], self._output_dtypes[spec.name])
                    for spec in self.outputs
                }
        except ServingError:
            raise
        except Exception as exc:
            raise call_error(self.name, rows, exc) from exc
        short = [name for name, array in answer.items() if array.ndim == 0 or len(array) != rows]
        if short:
            raise BackendFault(
                f"model {self.name!r}: output(s) {short} do not hold one row per input row ({rows} rows in)"
            )
        return answer

    def _named(self, result: Any) -> dict[str, torch.Tensor]:
        if isinstance(result, Mapping):
            return {str(key): value for key, value in result.items()}
        flat = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(flat) != len(self._output_names):
            raise BackendFault(
                f"model {self.name!r}: forward returned {len(flat)} value(s); expected "
                f"{len(self._output_names)} ({list(self._output_names)})"
            )
        return dict(zip(self._output_names, flat, strict=True))


class PyTorchBackend:
    """Loads ``<version>/model.pt2`` (torch.export) or ``<version>/model.pt`` (TorchScript)."""

    platform = PLATFORM

    def __init__(self) -> None:
        self._placement = placement()

    def load(self, source: ModelSource) -> PyTorchModel:
        where = f"model {source.name!r} version {source.version}"
        artifact = _find_artifact(source.path, where)
        try:
            if artifact.name == EXPORT_FILE_NAME:
                model = self._load_exported(source, artifact)
            else:
                model = self._load_script(source, artifact)
            warm_up(
                model,
                functools.partial(_warmup_inputs, model.inputs, model.example_row_shapes),
                source.config.warmup,
                source.config.max_batch_size,
                f"{where} ({artifact.name})",
            )
        except ArchiveRefused as exc:  # its message goes on from the file's name
            raise ModelLoadError(f"{where}: {artifact} {exc}") from exc
        except SpecMismatch as exc:
            raise ModelLoadError(f"{where} ({artifact}): {exc}") from exc
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"{where}: cannot load {artifact}: {type(exc).__name__}: {exc}") from exc
        return model

    def _load_exported(self, source: ModelSource, artifact: Path) -> PyTorchModel:
        archive = check_exported_program(
            artifact, torch.__version__, self._placement.settings.max_unpacked_bytes
        )
        program = torch.export.load(io.BytesIO(archive.data))
        _check_calls(program)
        found_inputs, found_outputs = program_specs(program)
        inputs = agreed_inputs(source.config.inputs, found_inputs)
        outputs = agreed_outputs(source.config.outputs, found_outputs)
        device = self._placement.device
        if self._placement.on_gpu:
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        module = program.module()
        in_spec = program.call_spec.in_spec
        by_name = {spec.name: spec for spec in found_inputs}
        # The program takes its inputs in its own order; config.yaml may list them in another.
        order = [next(i for i, spec in enumerate(inputs) if spec.name == name) for name in by_name]

        def call(tensors: list[torch.Tensor]) -> Any:
            args, kwargs = pytree.tree_unflatten([tensors[index] for index in order], in_spec)
            return module(*args, **kwargs)

        return PyTorchModel(
            name=source.name,
            version=source.version,
            platform=EXPORT_PLATFORM,
            artifact=artifact,
            inputs=inputs,
            outputs=outputs,
            model_dtypes=_casts(inputs, by_name),
            output_names=_served_output_names(outputs, found_outputs),
            call=call,
            device=device,
            example_row_shapes=_example_row_shapes(program, [spec.name for spec in found_inputs]),
        )

    def _load_script(self, source: ModelSource, artifact: Path) -> PyTorchModel:
        data = check_torchscript(artifact, self._placement.settings.max_unpacked_bytes)
        device = self._placement.device
        with warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript; its warning is said once, in the log, below
            warnings.filterwarnings(
                "ignore", message=r".*torch\.jit\.load.* is deprecated", category=DeprecationWarning
            )
            module = torch.jit.load(io.BytesIO(data), map_location=device)
        if _torchscript_deprecated():
            logger.warning(
                "model %r version %d is TorchScript (%s), which torch %s deprecates: it is served, but "
                "export the model with torch.export to %s for later releases",
                source.name,
                source.version,
                artifact.name,
                torch.__version__,
                EXPORT_FILE_NAME,
            )
        module.eval()
        _check_script_calls(module)
        parameters = [argument.name for argument in module.forward.schema.arguments[1:]]
        inputs, outputs = script_specs(source.config, parameters)
        by_parameter = {spec.name: index for index, spec in enumerate(inputs)}

        def call(tensors: list[torch.Tensor]) -> Any:
            return module(*(tensors[by_parameter[name]] for name in parameters))

        return PyTorchModel(
            name=source.name,
            version=source.version,
            platform=SCRIPT_PLATFORM,
            artifact=artifact,
            inputs=inputs,
            outputs=outputs,
            model_dtypes=[None] * len(inputs),
            output_names=[spec.name for spec in outputs],
            call=call,
            device=device,
        )


def _example_row_shapes(
    program: torch.export.ExportedProgram, names: list[str]
) -> dict[str, tuple[int, ...]]:
    """Per-row shapes of the inputs the program was exported with, when it kept them."""
    example = getattr(program, "example_inputs", None)
    if not example:
        return {}
    leaves = pytree.tree_leaves(example)
    if len(leaves) != len(names) or not all(isinstance(leaf, torch.Tensor) and leaf.ndim for leaf in leaves):
        return {}
    return {name: tuple(int(dim) for dim in leaf.shape[1:]) for name, leaf in zip(names, leaves, strict=True)}


def _warmup_inputs(
    specs: tuple[TensorSpec, ...], example_row_shapes: Mapping[str, tuple[int, ...]], rows: int
) -> dict[str, np.ndarray]:
    """Zeros of ``rows`` rows: free dimensions as long as in the example inputs, else 1."""
    inputs = {}
    for spec in specs:
        example = example_row_shapes.get(spec.name)
        if example is not None and len(example) == len(spec.shape):
            shape = tuple(e if dim == -1 else dim for dim, e in zip(spec.shape, example, strict=True))
            inputs[spec.name] = np.zeros((rows, *shape), dtype=numpy_dtype(spec.dtype))
        else:
            inputs[spec.name] = zeros(spec, rows)
    return inputs


def _torchscript_deprecated() -> bool:
    """Whether the installed torch deprecates TorchScript (2.13 and later say so when loading it)."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


def _casts(inputs: tuple[TensorSpec, ...], model: Mapping[str, TensorSpec]) -> list[torch.dtype | None]:
    return [
        None if spec.dtype == model[spec.name].dtype else torch_dtype(model[spec.name].dtype)
        for spec in inputs
    ]


def _served_output_names(outputs: tuple[TensorSpec, ...], found: tuple[TensorSpec, ...]) -> list[str]:
    """Per output of the program, the name it is served under: config.yaml renames positional ones."""
    found_names = [spec.name for spec in found]
    if {spec.name for spec in outputs} == set(found_names):
        return found_names
    return [spec.name for spec in outputs]


def _find_artifact(version_dir: Path, where: str) -> Path:
    if not version_dir.is_dir():
        raise ModelLoadError(f"{where}: version folder {version_dir} does not exist")
    present = [
        version_dir / name for name in (EXPORT_FILE_NAME, SCRIPT_FILE_NAME) if (version_dir / name).is_file()
    ]
    if len(present) == 1:
        return present[0]
    if present:
        raise ModelLoadError(
            f"{where}: {version_dir} holds both {EXPORT_FILE_NAME} and {SCRIPT_FILE_NAME}; keep one"
        )
    found = sorted(path.name for path in version_dir.iterdir())
    raise ModelLoadError(
        f"{where}: no PyTorch model in {version_dir}: expected {EXPORT_FILE_NAME} (torch.export) or "
        f"{SCRIPT_FILE_NAME} (TorchScript); found {found}"
    )


def _check_calls(program: torch.export.ExportedProgram) -> None:
    """Every call of every graph is an ATen/prims operator, listed control flow or shape arithmetic."""
    from torch._export.serde.serialize import _SYM_OPS

    allowed_functions = {*_SYM_OPS, operator.getitem}
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op in ("call_method", "call_module"):
                raise ArchiveRefused(
                    f"holds a {node.op} node ({node.target!r}); expected operator calls only"
                )
            if node.op != "call_function":
                continue
            target = node.target
            if isinstance(target, torch._ops.OpOverload) and target.namespace in ALLOWED_NAMESPACES:
                if target._schema.name.split("::")[1] in FILE_OPERATORS:
                    raise ArchiveRefused(f"calls {target!r}, which reads or writes files; it is never run")
                continue
            if isinstance(target, torch._ops.HigherOrderOperator) and (
                f"torch.ops.higher_order.{target.name()}" in ALLOWED_HIGHER_ORDER
            ):
                continue
            if target in allowed_functions:
                continue
            raise ArchiveRefused(f"calls {target!r}, which is not an ATen or prims operator")


def _check_script_calls(module: torch.jit.ScriptModule) -> None:
    """TorchScript's forward, with every method it calls inlined, uses no file operator."""
    blocks = [module.forward.inlined_graph]  # type: ignore[attr-defined]
    while blocks:
        for node in blocks.pop().nodes():
            kind = node.kind()
            if kind.startswith("aten::") and kind.split("::")[1] in FILE_OPERATORS:
                raise ArchiveRefused(f"calls {kind}, which reads or writes files; it is never run")
            blocks.extend(node.blocks())


def _to_torch(array: np.ndarray, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    """A tensor of ``array``: a view on the CPU (DLPack takes read-only arrays, from_numpy warns)."""
    try:
        tensor = torch.from_dlpack(array)
    except (BufferError, RuntimeError, TypeError):  # a layout or dtype DLPack cannot carry
        tensor = torch.from_numpy(np.array(array, copy=True))
    if dtype is not None or tensor.device != device:
        tensor = tensor.to(device=device, dtype=dtype)
    return tensor


def _to_numpy(tensor: Any, dtype: torch.dtype) -> np.ndarray:
    if not isinstance(tensor, torch.Tensor):
        raise BackendFault(f"the model returned a {type(tensor).__name__} where a tensor was expected")
    if tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor.detach().cpu().numpy()
