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
        description="how long a request of a Predict stream that finds its application's share of a "
        "model's queue full waits for room (its stream read no further meanwhile) before it is refused "
        "RESOURCE_EXHAUSTED; 0: refused at once, and the client backs off and sends it again",
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
