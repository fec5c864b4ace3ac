"""The storage under test: one module per kind (a directory or device, a Ceph RBD pool, an iSCSI
LUN) behind one interface (``kind``) and listed in ``registry``; the images made on it, and the
checks that keep iomatrix off anything the user did not name."""

from iomatrix.targets.workspace import Image, Workspace, nearest_existing

__all__ = ["Image", "Workspace", "nearest_existing"]
