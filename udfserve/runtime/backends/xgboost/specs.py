"""A booster's one input and its output, read from the booster's own configuration, and their
agreement with config.yaml.

A booster takes one matrix: a row of ``num_feature`` numbers, NaN where a value is missing. It is
served as one float32 input of per-row shape ``(num_feature,)``, named ``features`` unless
config.yaml declares its one input under another name (a Spark column of that name then feeds it).

What a row gives back follows the objective (``inplace_predict``'s shapes):

- ``multi:softprob``: ``probabilities``, one per class, ``(num_class,)``;
- ``binary:logistic``: ``probability``, ``()``;
- any other objective (regression, ``binary:logitraw``, ``multi:softmax``'s class index, ranking,
  survival, counts): ``prediction``, ``()``;
- a booster of several targets (multi-output trees, several quantiles, multi-label logistic):
  the same name with one value per target, ``(num_target,)``.

Only tree boosters (``gbtree``, ``dart``) are served: XGBoost has no in-place prediction for
``gblinear``, so such a file is refused at load rather than copied into a DMatrix at every call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from udfserve.runtime.backends.spec_agreement import SpecMismatch, agreed_specs
from udfserve.runtime.tensor_spec import TensorSpec

INPUT_NAME = "features"
"""The input's name unless config.yaml declares another."""
TREE_BOOSTERS = ("gbtree", "dart")
"""The boosters ``inplace_predict`` runs."""


@dataclass(frozen=True)
class BoosterSpecs:
    """What a loaded booster takes and gives, as the server carries it."""

    objective: str
    num_features: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def learner_config(booster: Any) -> dict[str, Any]:
    """The ``learner`` part of the booster's configuration (``Booster.save_config``)."""
    learner: dict[str, Any] = json.loads(booster.save_config())["learner"]
    return learner


def output_spec(objective: str, num_class: int, num_target: int) -> TensorSpec:
    """The one output of a booster of ``objective`` (module docstring: names and shapes)."""
    if objective == "multi:softprob":
        return TensorSpec(name="probabilities", dtype="float32", shape=(num_class,))
    shape = (num_target,) if num_target > 1 else ()
    name = "probability" if objective == "binary:logistic" else "prediction"
    return TensorSpec(name=name, dtype="float32", shape=shape)


def booster_specs(
    booster: Any,
    declared_inputs: tuple[TensorSpec, ...] | None,
    declared_outputs: tuple[TensorSpec, ...] | None,
) -> BoosterSpecs:
    """The booster's specs, config.yaml's where it declares them and they agree;
    ``SpecMismatch`` saying what differs, or why the booster cannot be served."""
    learner = learner_config(booster)
    kind = learner["gradient_booster"]["name"]
    if kind not in TREE_BOOSTERS:
        raise SpecMismatch(
            f"the booster is {kind!r}, which XGBoost cannot predict in place; expected a tree booster "
            f"({' or '.join(TREE_BOOSTERS)})"
        )
    parameters = learner["learner_model_param"]
    objective = learner["objective"]["name"]
    num_features = int(parameters["num_feature"])
    found_output = output_spec(objective, int(parameters["num_class"]), int(parameters["num_target"]))
    outputs = agreed_specs("output", declared_outputs, (found_output,), holder="booster")
    inputs = agreed_specs(
        "input", _named_input(declared_inputs), (_input(declared_inputs, num_features),), holder="booster"
    )
    return BoosterSpecs(objective, num_features, inputs, outputs)


def _named_input(declared: tuple[TensorSpec, ...] | None) -> tuple[TensorSpec, ...] | None:
    if declared is not None and len(declared) != 1:
        raise SpecMismatch(
            f"config.yaml declares inputs {[spec.name for spec in declared]}; expected one: a booster "
            "takes one matrix, a row of numbers per row"
        )
    return declared


def _input(declared: tuple[TensorSpec, ...] | None, num_features: int) -> TensorSpec:
    name = declared[0].name if declared else INPUT_NAME
    return TensorSpec(name=name, dtype="float32", shape=(num_features,))
