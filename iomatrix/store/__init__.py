"""The results store: one SQLite file, a versioned schema migrated forward (``schema``), and the
only module that writes SQL (``repo``)."""

from iomatrix.store.repo import Store

__all__ = ["Store"]
