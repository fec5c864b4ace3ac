"""Data in another program's own shape, named where it crosses iomatrix's packages.

Data of iomatrix's own crosses a package as a typed record (issue 32: no ``dict[str, Any]``
across a boundary). What is left is the shape of another program, open by its definition:
QEMU's QAPI objects (a ``--blockdev`` node, a QMP answer; each driver has options of its own)
and a suite's table as its author wrote it (TOML's values, before validation). A record there
would either copy QEMU's schema or lose what it does not list, so these stay mappings, under a
name that says whose shape they are; ``tests/test_layout.py`` refuses a bare one."""

from __future__ import annotations

from typing import Any, TypeAlias

BlockdevOptions: TypeAlias = dict[str, Any]
"""One node of a block graph as QEMU's ``--blockdev``/``blockdev-add`` takes it (QAPI
``BlockdevOptions``: ``driver``, ``node-name`` and the driver's own options)."""

QmpObject: TypeAlias = dict[str, Any]
"""One object of a QMP answer (``query-block``, ``query-blockstats``,
``query-named-block-nodes``), or one iomatrix hands QEMU in a QAPI type's shape (an
``IOThreadVirtQueueMapping`` of a device's ``iothread-vq-mapping``), as QEMU's QAPI schema
defines it."""

TomlTable: TypeAlias = dict[str, Any]
"""A suite's table as written (TOML's values, nothing validated or filled in yet)."""
