"""The ground every typed model stands on, and the words a setting is shown with."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable model that refuses fields it does not declare."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def on_off(value: bool) -> str:
    """A boolean setting as iomatrix, Proxmox and QEMU's ``-device`` options write it."""
    return "on" if value else "off"


def shown(value: object) -> str:
    """A setting's value as text for people: booleans as on/off, sequences comma-separated."""
    if isinstance(value, bool):
        return on_off(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(shown(v) for v in value)
    return str(value)
