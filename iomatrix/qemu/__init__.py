"""QEMU: configuration → arguments (shared by every driver), QMP helpers, probes."""
