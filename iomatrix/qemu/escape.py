"""QEMU's option syntax."""


def qemu_escape(value: str) -> str:
    """A QEMU option value with each comma doubled, as QEMU's option syntax requires."""
    return value.replace(",", ",,")
