"""QEMU's option syntax."""


def qemu_escape(value: str) -> str:
    """A QEMU option value with each comma doubled, as QEMU's option syntax requires."""
    return value.replace(",", ",,")


def qemu_bool(value: bool) -> str:
    """A boolean as QMP and ``-blockdev`` JSON-style options write it."""
    return "true" if value else "false"
