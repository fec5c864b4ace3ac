"""A run copied from one store into another, known by its uuid (``Store.copy_run``: ``iomatrix
db copy``, a cluster node's share gathered into the controller's run): every row as stored,
checked first as the store reads it back, in one transaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from iomatrix.core.errors import RunNotFound, StoreError
from iomatrix.store.base import Row, StoreBase
from iomatrix.store.records import author_uid, suite_author
from iomatrix.store.rows import check_row
from iomatrix.store.runs import node_row
from iomatrix.vocab.words import RunStatus


class CopyOutcome(NamedTuple):
    """What ``Store.copy_run`` did with one run."""

    source_id: int
    copy_id: int | None
    action: str
    """copied | updated | present | skipped"""
    detail: str


class Copying(StoreBase):
    """Runs copied in from another store (the part of ``Store`` that writes copies)."""

    def copy_run(self, source: StoreBase, run_id: int, *, share: bool = False) -> CopyOutcome:
        """Run ``run_id`` of ``source`` into this store, in one transaction, known by its uuid:
        a run this store lacks is added whole (under a new number; without its owner, its
        processes and what they made on disk, which are the source host's); a run it has gets
        the trials it lacks, a trial measured again (``--retry-failed``) replaces the stored
        one, and the run's status, end and notes follow the source's. Every value is copied as
        stored: samples, raw fio output, telemetry. A run still being measured is not copied.
        With ``share`` the source run is a node's share of this store's cluster run: only its
        trials (and their history) are copied, whatever its status; the run keeps its own."""
        (run,) = source._dicts("SELECT * FROM runs WHERE id = ?", (run_id,)) or [None]
        if run is None:
            raise RunNotFound(f"{source.where}: no run {run_id}")
        if source.stored_version < 7:
            raise StoreError(f"{source.where}: schema version {source.stored_version} keeps no "
                             "run uuids, by which a copied run is known again",
                             hint="open it once with a command that writes (`iomatrix clean "
                                  "--db ...`) to migrate it")
        if run["status"] == RunStatus.RUNNING and not share:
            return CopyOutcome(run_id, None, "skipped", "it is still being measured, or was "
                               "killed: resume it, or let it end, then copy")
        rows = _read_run(source, run, run_id)
        with self._transaction():
            row = self.conn.execute("SELECT id FROM runs WHERE uuid = ?", (run["uuid"],)).fetchone()
            if row is None and share:
                raise RunNotFound(f"{self.where}: no cluster run {run['uuid']} to copy a node's "
                                  "share into")
            if row is None:
                dst = self._add_run(source, rows)
            else:
                dst = int(row[0])
                if not share:
                    self.conn.execute("UPDATE runs SET status = ?, finished_at = ?, "
                                      "notes_json = ? WHERE id = ?",
                                      (run["status"], run["finished_at"], run["notes_json"], dst))
            added = self._add_trials(dst, rows)
            # the source's pilot, whole; a node's share carries none (the run's is the controller's)
            for table, pilot in zip(("pilot_trials", "trial_plans"), [] if share else rows.pilot):
                self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (dst,))
                self._insert_rows(table, [{**r, "run_id": dst} for r in pilot], skip=("id",),
                                  keyed=False)
        if row is None:
            return CopyOutcome(run_id, dst, "copied", f"{added} trials")
        return CopyOutcome(run_id, dst, "updated" if added else "present",
                           f"{added} new trials" if added else "nothing new")

    def _add_run(self, source: StoreBase, rows: _RunRows) -> int:
        """Inside copy_run's transaction: the run this store lacks, with its configurations,
        workloads and nodes; its new id."""
        run = rows.run
        # who could have written the suite: the row's, unless the source store (a shared one,
        # say) let another user change it
        author = suite_author(run.get("suite_author"), source.author, source.where)
        run["suite_author"] = run.get("suite_author") if author.trusted else author_uid(author)
        (dst,) = self._insert_rows("runs", [run], skip=("id", "owner_id"))
        for table, found in (("configurations", rows.configs), ("workloads", rows.workloads),
                             ("run_nodes", rows.nodes)):
            self._insert_rows(table, [{**r, "run_id": dst} for r in found], skip=("id",),
                              keyed=table != "run_nodes")
        return dst

    def _add_trials(self, dst: int, rows: _RunRows) -> int:
        """Inside copy_run's transaction: the trials run ``dst`` lacks (a trial measured again
        at the source replaces its stored one), their samples and the history it lacks; how
        many trials were added."""
        ids = {table: {r[0]: r[1] for r in self.conn.execute(
            f"SELECT key, id FROM {table} WHERE run_id = ?", (dst,))}
            for table in ("configurations", "workloads")}
        have = {(r[0], r[1], r[2]): (r[3], r[4]) for r in self.conn.execute(
            "SELECT c.key, w.key, t.sample_index, t.id, t.started_at FROM trials t "
            "JOIN configurations c ON c.id = t.configuration_id "
            "JOIN workloads w ON w.id = t.workload_id WHERE t.run_id = ?", (dst,))}
        new = []
        for t in rows.trials:
            stored = have.get((t["config_key"], t["workload_key"], t["sample_index"]))
            if stored is not None and stored[1] == t["started_at"]:
                continue                            # the same trial
            if stored is not None:                  # measured again at the source
                self.conn.execute("DELETE FROM trials WHERE id = ?", (stored[0],))
            new.append(t)
        trial_ids = self._insert_rows("trials", [{
            **t, "run_id": dst, "configuration_id": ids["configurations"][t["config_key"]],
            "workload_id": ids["workloads"][t["workload_key"]]} for t in new],
            skip=("id", "config_key", "workload_key"))
        for table, by_trial in rows.samples.items():
            self._insert_rows(table, [{**s, "trial_id": trial_id}
                                      for t, trial_id in zip(new, trial_ids, strict=True)
                                      for s in by_trial.get(t["id"], ())], keyed=False)
        retired = {(r[0], r[1], r[2], r[3]) for r in self.conn.execute(
            "SELECT config_key, workload_key, sample_index, retired_at FROM trial_history "
            "WHERE run_id = ?", (dst,))}
        self._insert_rows("trial_history", [
            {**h, "run_id": dst} for h in rows.history if (h["config_key"], h["workload_key"],
                                                           h["sample_index"], h["retired_at"])
            not in retired], skip=("id",))
        return len(new)

    def _insert_rows(self, table: str, rows: list[Row], *,
                     skip: tuple[str, ...] = (), keyed: bool = True) -> list[int]:
        """Insert ``rows`` (column → value, as one query of another store gave them: the same
        columns each) but ``skip``; their new ids, in order, when the table is ``keyed`` by one.
        PostgreSQL gets them in one COPY: a round trip per row made copying a 30,000-trial run
        take half a minute."""
        if not rows:
            return []
        names = [n for n in rows[0] if n not in skip]
        values = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in
                        (row[n] for n in names)) for row in rows]
        if self.postgres:
            return self.conn.insert_rows(table, names, values, keyed=keyed)
        statement = (f"INSERT INTO {table} ({', '.join(names)}) "
                     f"VALUES ({', '.join('?' * len(names))})")
        if keyed:
            return [self._insert(statement, v) for v in values]
        self.conn.executemany(statement, values)
        return []


def _grouped(rows: list[Row]) -> dict[int, list[Row]]:
    """Sample rows by their trial's id."""
    out: dict[int, list[Row]] = {}
    for r in rows:
        out.setdefault(r["trial_id"], []).append(r)
    return out


def _check_copied(tables: Mapping[str, list[Row]]) -> None:
    """``DamagedStore`` unless every row a run's copy carries reads back as the store reads
    it (``rows.check_row``): a damaged row is not spread to another store."""
    for table, rows in tables.items():
        for r in rows:
            check_row(table, r, node_row(r.get("run_id"), r.get("position"))
                      if table == "run_nodes" else r.get("id", r.get("run_id")))


class _RunRows(NamedTuple):
    """A run's rows in its source store, each as one query gave them (column → value)."""

    run: Row
    configs: list[Row]
    workloads: list[Row]
    trials: list[Row]
    """With their configuration's and workload's keys (``config_key``, ``workload_key``)."""
    samples: dict[str, dict[int, list[Row]]]
    """``samples`` and ``vm_samples``: their rows by trial id."""
    history: list[Row]
    pilot: list[list[Row]]
    """``pilot_trials`` and ``trial_plans`` (none before schema 9)."""
    nodes: list[Row]


def _read_run(source: StoreBase, run: Row, run_id: int) -> _RunRows:
    """Every row of run ``run_id`` (``run``, its row of ``runs``) that a copy carries, each
    checked as the store reads it back (``_check_copied``)."""
    configs = source._dicts("SELECT * FROM configurations WHERE run_id = ? ORDER BY id",
                            (run_id,))
    workloads = source._dicts("SELECT * FROM workloads WHERE run_id = ? ORDER BY id", (run_id,))
    trials = source._dicts(
        "SELECT t.*, c.key AS config_key, w.key AS workload_key FROM trials t "
        "JOIN configurations c ON c.id = t.configuration_id "
        "JOIN workloads w ON w.id = t.workload_id WHERE t.run_id = ? ORDER BY t.id", (run_id,))
    samples = {table: _grouped(source._dicts(
        f"SELECT s.* FROM {table} s JOIN trials t ON t.id = s.trial_id WHERE t.run_id = ?",
        (run_id,))) for table in ("samples", "vm_samples")}
    history = source._dicts("SELECT * FROM trial_history WHERE run_id = ? ORDER BY id", (run_id,))
    pilot = [source._dicts(f"SELECT * FROM {table} WHERE run_id = ?", (run_id,))
             for table in ("pilot_trials", "trial_plans")] if source.stored_version >= 9 else []
    nodes = (source._dicts("SELECT * FROM run_nodes WHERE run_id = ?", (run_id,))
             if source.stored_version >= 10 else [])
    _check_copied({"runs": [run], "configurations": configs, "workloads": workloads,
                   "trials": trials, "trial_history": history, "run_nodes": nodes,
                   **dict(zip(("pilot_trials", "trial_plans"), pilot))})
    return _RunRows(run, configs, workloads, trials, samples, history, pilot, nodes)
