"""QEMU: configuration → arguments (shared by every driver and by ``recommend``), block-node
flags, QMP helpers, /proc inspection of a running QEMU, and QEMU's option syntax (``escape``)."""
