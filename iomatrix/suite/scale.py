"""[scale.NAME]: how a suite changes at a scale (``run --scale NAME``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from iomatrix.core.model import Frozen
from iomatrix.suite.fields import SCALE_NAME, Printable
from iomatrix.suite.matrix import Matrix
from iomatrix.suite.method import Method
from iomatrix.suite.target import Target


class ScaleInfo(Frozen):
    """One [scale.NAME] table of a suite, as ``iomatrix suites`` and ``run --plan`` list it."""

    name: str = Field(max_length=40, pattern=SCALE_NAME)
    description: Printable = Field(default="", max_length=10_000)


class Scale(Frozen):
    """A [scale.NAME] table: how the suite changes at that scale (``run --scale NAME``).
    [target], [matrix] and [method] keys given here replace the suite's own, key by key; a
    [[workloads]], [[part]] or [[targets]] list given here replaces the suite's whole list. The
    result is validated as a whole suite. Values are checked there, names here (unknown keys
    refused)."""

    description: Printable = Field(default="", max_length=10_000)
    """What the scale is for ("a few minutes: ..."); ``iomatrix suites`` and ``run --plan``
    show it."""
    target: dict[str, Any] = {}
    """``[scale.NAME.target]``: [target] keys that replace the suite's own, key by key."""
    matrix: dict[str, Any] = {}
    """``[scale.NAME.matrix]``: [matrix] keys that replace the suite's own, key by key."""
    method: dict[str, Any] = {}
    """``[scale.NAME.method]``: [method] keys that replace the suite's own, key by key."""
    workloads: list[dict[str, Any]] | None = None
    """``[[scale.NAME.workloads]]``: replaces the suite's whole [[workloads]] list."""
    part: list[dict[str, Any]] | None = None
    """``[[scale.NAME.part]]``: replaces the suite's whole [[part]] list."""
    targets: list[dict[str, Any]] | None = None
    """``[[scale.NAME.targets]]``: replaces the suite's whole [[targets]] list."""

    @field_validator("workloads", mode="before")
    @classmethod
    def _one_table(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("target", "matrix", "method")
    @classmethod
    def _known_keys(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        model = {"target": Target, "matrix": Matrix, "method": Method}[str(info.field_name)]
        unknown = sorted(set(value) - set(model.model_fields))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} (not a [{info.field_name}] key)")
        return value
