"""A PyTorch model's inputs and outputs: read from an exported program, agreed with config.yaml.

A ``torch.export`` program records its inputs (names from ``forward``'s parameters, dtypes,
shapes with symbolic dimensions) and its outputs. The rules:

- every input's first dimension must be dynamic (``torch.export.Dim``): the batch; other
  symbolic dimensions are free (-1);
- outputs are named by the structure ``forward`` returns: a dict's keys, or ``output_0``,
  ``output_1``, ... for a tensor, tuple or list, which config.yaml's ``outputs`` may rename in
  order; nested structures are not served;
- config.yaml's declared specs, when given, must name the same inputs (and dict outputs), may
  fix a dimension the program leaves free, and may declare another numeric dtype (the backend
  casts it).

TorchScript records none of this: its specs come from config.yaml only (``script_specs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from udfserve.runtime.model_config import ModelConfig
from udfserve.runtime.tensor_spec import STRING_DTYPE, SUPPORTED_DTYPES, TensorSpec, shape_text

POSITIONAL_OUTPUT = "output_{}"
DYNAMIC_BATCH_HINT = (
    "export it with a dynamic batch dimension: torch.export.export(model, args, "
    "dynamic_shapes={...: {0: torch.export.Dim('batch')}})"
)
SCRIPT_CONFIG_EXAMPLE = (
    "inputs: [{name: features, dtype: float32, shape: [64]}] and outputs: [{name: probabilities, "
    "dtype: float32, shape: [8]}], the inputs named as forward's parameters"
)


class SpecMismatch(Exception):
    """The model does not fit config.yaml or cannot be served; the message says what to change."""


def dtype_name(dtype: Any, what: str) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in SUPPORTED_DTYPES or name == STRING_DTYPE:
        raise SpecMismatch(
            f"{what} has dtype {name}, which is not served; expected one of {SUPPORTED_DTYPES[:-1]}"
        )
    return name


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def _row_shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, torch.Tensor):
        raise SpecMismatch(f"{what} is a {type(value).__name__}, not a tensor; only tensors are served")
    dims = list(value.shape)
    if not dims:
        raise SpecMismatch(f"{what} is a scalar, without a batch dimension; {DYNAMIC_BATCH_HINT}")
    if not isinstance(dims[0], torch.SymInt):
        raise SpecMismatch(
            f"{what} has a fixed batch dimension {dims[0]} (shape {tuple(dims)}); {DYNAMIC_BATCH_HINT}"
        )
    return tuple(-1 if isinstance(dim, torch.SymInt) else int(dim) for dim in dims[1:])


def program_specs(
    program: torch.export.ExportedProgram,
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs and outputs of an exported program, outputs named as the module docstring says."""
    nodes = {node.name: node for node in program.graph.nodes}
    inputs = []
    for name in program.graph_signature.user_inputs:
        value = nodes[name].meta.get("val")
        what = f"input {name!r}"
        inputs.append(
            TensorSpec(
                name=name,
                dtype=dtype_name(getattr(value, "dtype", None), what),
                shape=_row_shape(value, what),
            )
        )
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    flat_outputs = list(output_node.args[0])[-len(program.graph_signature.user_outputs) :]
    names = output_names(program.call_spec.out_spec, len(flat_outputs))
    outputs = []
    for name, node in zip(names, flat_outputs, strict=True):
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        what = f"output {name!r}"
        outputs.append(
            TensorSpec(
                name=name,
                dtype=dtype_name(getattr(value, "dtype", None), what),
                shape=_row_shape(value, what),
            )
        )
    return tuple(inputs), tuple(outputs)


def output_names(spec: pytree.TreeSpec | None, count: int) -> list[str]:
    """Names of the flat outputs of a program returning ``spec``."""
    if spec is None or spec.is_leaf():
        return [POSITIONAL_OUTPUT.format(0)]
    children = spec.children()
    if not all(child.is_leaf() for child in children):
        raise SpecMismatch(
            f"forward returns a nested structure ({spec.type.__name__} holding containers); expected a "
            "tensor, a tuple or list of tensors, or a dict of tensors"
        )
    if spec.type is dict or getattr(spec.type, "__name__", "") == "OrderedDict":
        names = [str(key) for key in spec.context]
        if len(set(names)) != len(names):
            raise SpecMismatch(
                f"forward returns a dict with keys {spec.context} that are not distinct as text"
            )
        return names
    return [POSITIONAL_OUTPUT.format(index) for index in range(count)]


def agreed_inputs(
    declared: Sequence[TensorSpec] | None, found: tuple[TensorSpec, ...]
) -> tuple[TensorSpec, ...]:
    """config.yaml's inputs when they fit the program's, else the program's own."""
    if declared is None:
        return found
    by_name = {spec.name: spec for spec in found}
    _same_names("input", [spec.name for spec in declared], list(by_name))
    for spec in declared:
        _fits("input", spec, by_name[spec.name])
    return tuple(declared)


def agreed_outputs(
    declared: Sequence[TensorSpec] | None, found: tuple[TensorSpec, ...]
) -> tuple[TensorSpec, ...]:
    """config.yaml's outputs when they fit: by name for a dict, in order (renaming) for positional ones."""
    if declared is None:
        return found
    positional = all(spec.name == POSITIONAL_OUTPUT.format(index) for index, spec in enumerate(found))
    if positional:
        if len(declared) != len(found):
            raise SpecMismatch(
                f"config.yaml declares {len(declared)} output(s) {[s.name for s in declared]}, but forward "
                f"returns {len(found)} tensor(s); declare one output per returned tensor, in order"
            )
        pairs = list(zip(declared, found, strict=True))
    else:
        by_name = {spec.name: spec for spec in found}
        _same_names("output", [spec.name for spec in declared], list(by_name))
        pairs = [(spec, by_name[spec.name]) for spec in declared]
    for spec, model_spec in pairs:
        _fits("output", spec, model_spec)
    return tuple(declared)


def _same_names(kind: str, declared: list[str], found: list[str]) -> None:
    unknown = [name for name in declared if name not in found]
    missing = [name for name in found if name not in declared]
    if unknown or missing or len(set(declared)) != len(declared):
        raise SpecMismatch(
            f"config.yaml declares {kind}s {declared}, but the model's {kind}s are {found}"
            + (f"; not in the model: {unknown}" if unknown else "")
            + (f"; not declared: {missing}" if missing else "")
        )


def _fits(kind: str, declared: TensorSpec, model: TensorSpec) -> None:
    if declared.dtype == STRING_DTYPE:
        raise SpecMismatch(
            f"config.yaml declares {kind} {declared.name!r} as string; the PyTorch backend serves numeric "
            f"tensors only (the model's is {model.dtype})"
        )
    fits = len(declared.shape) == len(model.shape) and all(
        m == -1 or d == m for d, m in zip(declared.shape, model.shape, strict=True)
    )
    if not fits:
        raise SpecMismatch(
            f"config.yaml declares {kind} {declared.name!r} ({model.name!r} in the model) with per-row shape "
            f"{shape_text(declared.shape)}, but the model's is {shape_text(model.shape)} (* is free)"
        )


def script_specs(
    config: ModelConfig, parameters: list[str]
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """A TorchScript model's specs: config.yaml's, whose inputs must be forward's parameters."""
    if config.inputs is None or config.outputs is None:
        absent = " and ".join(
            kind for kind, given in (("inputs", config.inputs), ("outputs", config.outputs)) if given is None
        )
        raise SpecMismatch(
            f"TorchScript records no input or output specs, and config.yaml declares no {absent}; expected "
            f"config.yaml with {SCRIPT_CONFIG_EXAMPLE}"
        )
    declared = [spec.name for spec in config.inputs]
    if sorted(declared) != sorted(parameters):
        raise SpecMismatch(
            f"config.yaml declares inputs {declared}, but the TorchScript forward takes {parameters}; "
            "expected one input per parameter, named as the parameter"
        )
    for kind, specs in (("input", config.inputs), ("output", config.outputs)):
        for spec in specs:
            if spec.dtype == STRING_DTYPE:
                raise SpecMismatch(
                    f"config.yaml declares {kind} {spec.name!r} as string; the PyTorch backend serves "
                    "numeric tensors only"
                )
    return config.inputs, config.outputs
