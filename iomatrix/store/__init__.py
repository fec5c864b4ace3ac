"""The results store: one SQLite file, a versioned schema migrated forward (``schema``), the only
module that writes SQL (``repo``), the records it reads back (``records``), each value read as
the untrusted input it is (``rows``), and fio results measured elsewhere brought in as runs
(``ingest``)."""

from iomatrix.store.repo import Store

__all__ = ["Store"]
