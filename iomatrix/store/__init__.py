"""The results store: one SQLite file, a versioned schema migrated forward (``schema``), the only
code that writes SQL (``Store``, in ``repo``: it opens the database, and its parts are the SQL
of runs and trials, ``runs``; of processes, locks and resources, ``owners``; of a run copied
between stores, ``copying``; over ``base`` and SQLite's file, ``sqlite``), the device shares a
loaded run carries (``shares``), the records it reads back (``records``), each value read as
the untrusted input it is (``rows``), and fio results measured elsewhere brought in as runs
(``ingest``, a job group's workload and samples in ``jobgroups``)."""

from iomatrix.store.repo import Store

__all__ = ["Store"]
