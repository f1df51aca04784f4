"""Settings of how a model's queue serves the Spark applications that share it: fair by priority
class, or first come first served, and how long a request waits for room in its share."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from udfserve.services.model_server.priority_classes import parse_priority_classes


class SchedulingSettings(BaseModel):
    """Application scheduling and priority classes (``core.shares``)."""

    application_scheduling: Literal["fair", "fifo"] = Field(
        default="fair",
        description="how a model's queue serves Spark applications: 'fair' gives each application its "
        "priority class's weight in rows while it has requests waiting (requests naming no application "
        "form one more application), and bounds each one's part of the queue; 'fifo': one queue in "
        "arrival order",
    )
    priority_classes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("interactive=8", "default=2", "batch=1"),
        description="the priority classes a client may name (spark.udfserve.priorityClass) and their "
        "weights, 'name=weight' comma-separated; an application that names no class, or one not listed, "
        "gets --default-priority-class",
    )
    default_priority_class: str = Field(
        default="default", description="the class of applications that name none (one of --priority-classes)"
    )
    room_wait_s: float = Field(
        default=10.0,
        ge=0.0,
        le=600.0,
        description="how long a request that finds its application's share of a model's queue full waits "
        "in the server for room before it is refused as a full queue: a request of a Predict or KServe "
        "ModelStreamInfer stream (its stream read no further meanwhile), or a unary KServe call (gRPC "
        "ModelInfer, HTTP infer) while fewer than --room-wait-calls wait; 0: refused at once, and the "
        "client backs off and sends it again",
    )
    room_wait_calls: int = Field(
        default=16,
        ge=0,
        le=4096,
        description="how many unary KServe inference calls (gRPC ModelInfer on either KServe port, HTTP "
        "infer) may wait for room at once, over the server (each holds its handler and its message while "
        "it waits); a call past them is refused at once; 0: unary calls never wait",
    )

    @field_validator("priority_classes", mode="before")
    @classmethod
    def _split_classes(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("priority_classes")
    @classmethod
    def _check_classes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        parse_priority_classes(value)
        return value

    @property
    def class_weights(self) -> dict[str, int]:
        """``priority_classes`` as a mapping of class name to weight."""
        return parse_priority_classes(self.priority_classes)

    @model_validator(mode="after")
    def _default_class_is_listed(self) -> SchedulingSettings:
        if self.default_priority_class not in self.class_weights:
            raise ValueError(
                f"default_priority_class {self.default_priority_class!r} is not one of the priority classes "
                f"{sorted(self.class_weights)}; expected one of them"
            )
        return self
