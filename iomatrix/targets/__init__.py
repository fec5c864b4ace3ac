"""The storage under test: the target directory or device, the images made on it, and the checks
that keep iomatrix off anything the user did not name."""

from iomatrix.targets.workspace import Image, Workspace, nearest_existing

__all__ = ["Image", "Workspace", "nearest_existing"]
