"""The SQL of runs and trials: a run created, its trials recorded (a failed one retired to the
run's history when measured again), its nodes, notes, pilot and status; the runs listed, and a
run loaded back whole (``load_run``) with its configurations, workloads, trials and samples."""

from __future__ import annotations

import json
import re
import sqlite3
import uuid
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from iomatrix import __version__
from iomatrix.core.errors import RunNotFound, StoreError
from iomatrix.fio.samples import DirectionSample
from iomatrix.store.base import StoreBase, now
from iomatrix.store.records import (ConfigRecord, NodeRecord, PilotTrial, RetiredTrial,
                                    RunSummary, SteadyRecord, StoredRun, StoredSuite, TrialRecord,
                                    TrialResult, WorkloadRecord)
from iomatrix.store.rows import StoredPlan, damaged, decode, inflate, typed
from iomatrix.store.shares import with_device_shares
from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.telemetry.host import HostSeries
from iomatrix.telemetry.pagecache import stored_device


_SAMPLE_COLUMNS = ("direction", "iops", "bw_bytes", "io_bytes", "total_ios", "runtime_ms",
                   "lat_mean_ns", "lat_stdev_ns", "lat_min_ns", "lat_max_ns", "p50_ns", "p90_ns",
                   "p99_ns", "p99_9_ns", "p99_99_ns")


class Runs(StoreBase):
    """Runs and their trials, written and read (the part of ``Store`` that knows their SQL)."""

    # -- writing ---------------------------------------------------------------------------
    def create_run(self, *, suite: StoredSuite, host: Mapping[str, str], accelerator: str,
                   notes: Iterable[str], configs: Iterable[Configuration],
                   workloads: Iterable[Workload], seed: int | None = None,
                   owner: int | None = None, run_uuid: str | None = None) -> int:
        """A new run of ``suite`` with its configurations and workloads; its id. ``owner`` (a
        process from ``register_process``) owns it from the start, and its resources are the
        run's. ``run_uuid``: the uuid of the run this one is a part of (a node's share of a
        cluster run, kept on the node until it is copied into the cluster's); else a new one."""
        with self._transaction():
            run_id = self._insert(
                "INSERT INTO runs (suite_name, suite_source, suite_text, created_at, status, "
                "host_json, accelerator, iomatrix_version, notes_json, seed, owner_id, uuid, "
                "suite_author, spec_json) VALUES "
                "(?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (suite.name, suite.source, suite.text, now(), json.dumps(dict(host)), accelerator,
                 __version__, json.dumps(list(notes)), seed, owner, run_uuid or uuid.uuid4().hex,
                 suite.author, None if suite.spec is None else suite.spec.to_json()))
            if owner is not None:
                self.conn.execute("UPDATE resources SET run_id = ? WHERE process_id = ? "
                                  "AND run_id IS NULL", (run_id, owner))
            for c in configs:
                self.conn.execute(
                    "INSERT INTO configurations (run_id, key, label, mode, params_json) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (run_id, c.key, c.label, c.mode, json.dumps(c.params())))
            for w in workloads:
                self.conn.execute(
                    "INSERT INTO workloads (run_id, key, label, rw, bs, iodepth, numjobs, "
                    "rate_iops, options_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, w.key, w.label, w.rw, w.bs, w.iodepth, w.numjobs, w.rate_iops,
                     json.dumps(dict(w.options))))
        return run_id

    def record_trial(self, run_id: int, result: TrialResult, *,
                     replace_failed: bool = False) -> int:
        """One trial and its samples, atomically; the trial's id. With ``replace_failed``, a
        failed trial stored under the same key moves, whole, to the run's trial history in the
        same transaction (``trial_history``); an ok one still makes this a duplicate, refused
        with ``StoreError`` and nothing written."""
        try:
            return self._record_trial(run_id, result, replace_failed)
        except Exception as exc:
            # a unique key: SQLite's message, PostgreSQL's SQLSTATE unique_violation
            if not ((isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc))
                    or getattr(exc, "sqlstate", None) == "23505"):
                raise
            raise StoreError(f"run {run_id}: trial {result.config_key} × {result.workload_key} "
                             f"#{result.sample_index} is stored already") from exc

    def _record_trial(self, run_id: int, result: TrialResult, replace_failed: bool) -> int:
        with self._transaction():
            cid = self._id("configurations", run_id, result.config_key)
            wid = self._id("workloads", run_id, result.workload_key)
            if replace_failed:
                self._retire_failed(run_id, cid, wid, result.sample_index)
            trial_id = self._insert(
                "INSERT INTO trials (run_id, configuration_id, workload_id, sample_index, status, "
                "reason, started_at, wall_seconds, fio_version, usr_cpu, sys_cpu, ctx, fio_json, "
                "accelerator, applied_json, command, steady_json, cpu_json, telemetry_json, stall_json, "
                "depth_json, logs_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, cid, wid, result.sample_index, result.status, result.reason,
                 result.started_at, result.wall_seconds, result.fio_version, result.usr_cpu,
                 result.sys_cpu, result.ctx,
                 zlib.compress(result.fio_json.encode()) if result.fio_json else None,
                 result.accelerator, json.dumps(result.applied, sort_keys=True), result.command,
                 json.dumps(_stored_steady(result.steady)),
                 json.dumps(result.cpu.model_dump() if result.cpu else {}),
                 json.dumps(result.telemetry.model_dump() if result.telemetry else {}),
                 json.dumps(result.stall.model_dump() if result.stall else {}),
                 json.dumps(result.depth.model_dump() if result.depth else {}),
                 json.dumps(result.logs, sort_keys=True)))
            placeholders = ", ".join("?" * (len(_SAMPLE_COLUMNS) + 1))
            for s in result.samples:
                self.conn.execute(
                    f"INSERT INTO samples (trial_id, {', '.join(_SAMPLE_COLUMNS)}) "
                    f"VALUES ({placeholders})",
                    (trial_id, *(getattr(s, c) for c in _SAMPLE_COLUMNS)))
            for s in result.vm_samples:
                self.conn.execute(
                    f"INSERT INTO vm_samples (trial_id, vm, {', '.join(_SAMPLE_COLUMNS)}) "
                    f"VALUES (?, {placeholders})",
                    (trial_id, s.vm, *(getattr(s, c) for c in _SAMPLE_COLUMNS)))
        return trial_id

    def add_nodes(self, run_id: int, nodes: Iterable[tuple[str, Mapping[str, Any],
                                                           Mapping[str, str]]]) -> None:
        """The nodes of a cluster run: (name, its ``Node`` fields, its host metadata) each."""
        with self._transaction():
            for i, (name, node, host) in enumerate(nodes):
                self.conn.execute("INSERT INTO run_nodes (run_id, name, position, node_json, "
                                  "host_json) VALUES (?, ?, ?, ?, ?)",
                                  (run_id, name, i, json.dumps(dict(node)), json.dumps(dict(host))))

    def set_node(self, run_id: int, name: str, status: str, reason: str | None = None,
                 host: Mapping[str, str] | None = None) -> None:
        """How a node's share of a cluster run goes (and its host metadata, when known anew)."""
        with self._transaction():
            self.conn.execute("UPDATE run_nodes SET status = ?, reason = ? WHERE run_id = ? "
                              "AND name = ?", (status, reason, run_id, name))
            if host is not None:
                self.conn.execute("UPDATE run_nodes SET host_json = ? WHERE run_id = ? AND "
                                  "name = ?", (json.dumps(dict(host)), run_id, name))

    def run_by_uuid(self, run_uuid: str) -> int | None:
        """The run known by ``run_uuid`` in this store, or None."""
        row = self.conn.execute("SELECT id FROM runs WHERE uuid = ?", (run_uuid,)).fetchone()
        return int(row[0]) if row else None

    def run_uuid(self, run_id: int) -> str:
        row = self.conn.execute("SELECT uuid FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"{self.where}: no run {run_id}")
        return str(row[0])

    def finish_run(self, run_id: int, status: str) -> None:
        """The run's final status; it has no owner any more."""
        with self._transaction():
            self.conn.execute("UPDATE runs SET status = ?, finished_at = ?, owner_id = NULL "
                              "WHERE id = ?", (status, now(), run_id))

    def reopen_run(self, run_id: int) -> None:
        """Mark a run running again, for --resume."""
        with self._transaction():
            self.conn.execute("UPDATE runs SET status = 'running', finished_at = NULL "
                              "WHERE id = ?", (run_id,))

    def add_notes(self, run_id: int, notes: Iterable[str]) -> None:
        """Append notes to a run's (those it already has are not repeated)."""
        with self._transaction():
            row = self.conn.execute("SELECT notes_json FROM runs WHERE id = ?",
                                    (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(f"{self.where}: no run {run_id}")
            have = list(decode("runs", "notes_json", run_id, row[0]))
            have += [n for n in dict.fromkeys(notes) if n not in have]
            self.conn.execute("UPDATE runs SET notes_json = ? WHERE id = ?",
                              (json.dumps(have), run_id))

    def record_pilot(self, run_id: int, trials: Iterable[PilotTrial], plan: StoredPlan) -> None:
        """A run's pilot trials and the trial plan chosen from them (``[method] pilot``), at
        once; a pilot stored before (an interrupted run's) is replaced."""
        with self._transaction():
            self.conn.execute("DELETE FROM pilot_trials WHERE run_id = ?", (run_id,))
            for t in trials:
                self.conn.execute(
                    "INSERT INTO pilot_trials (run_id, mode, config_key, workload_key, round, "
                    "runtime_s, iops, wall_s, session_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, t.mode, t.config_key, t.workload_key, t.round, t.runtime_s, t.iops,
                     t.wall_s, t.session_s))
            # DELETE and INSERT rather than INSERT OR REPLACE: the same words on PostgreSQL
            self.conn.execute("DELETE FROM trial_plans WHERE run_id = ?", (run_id,))
            self.conn.execute("INSERT INTO trial_plans (run_id, plan_json) VALUES (?, ?)",
                              (run_id, json.dumps(plan.model_dump(), sort_keys=True)))


    def trial_history(self, run_id: int) -> list[RetiredTrial]:
        """The failed trials measured again (--retry-failed, or a trial whose guests stopped),
        oldest first, as they were."""
        return [typed(RetiredTrial, "trial_history", r[0], retired_at=r[1],
                      trial=decode("trial_history", "trial_json", r[0], r[2]))
                for r in self.conn.execute("SELECT id, retired_at, trial_json FROM trial_history "
                                           "WHERE run_id = ? ORDER BY id", (run_id,))]


    # -- reading ---------------------------------------------------------------------------
    def list_runs(self, *, host: str | None = None, suite: str | None = None,
                  target: str | None = None, since: str | None = None,
                  until: str | None = None) -> list[RunSummary]:
        """The stored runs, oldest first; those of one host (its hostname; a cluster run's,
        the controller's or a node's, by node name or hostname), suite, target (the
        directory or device, or one of its [[targets]]) and started within [since, until]
        (ISO dates or times, UTC; a date alone means the whole day), where given."""
        # compared here, not in SQL: PostgreSQL orders text by the database's locale
        end = None if until is None else until + ("~" if len(until) <= 10 else "")
        rows = self.conn.execute(
            "SELECT r.id, r.suite_name, r.created_at, r.finished_at, r.status, r.accelerator, "
            "  (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id AND t.status = 'ok'), "
            "  (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id AND t.status = 'failed'), "
            "  r.host_json FROM runs r ORDER BY r.id").fetchall()
        nodes: dict[int, list[str]] = {}
        hosts: dict[int, set[str]] = {}      # a cluster run's nodes: by name and hostname
        if self.version >= 10:
            for run_id, name, position, node_host in self.conn.execute(
                    "SELECT run_id, name, position, host_json FROM run_nodes "
                    "ORDER BY run_id, position"):
                where = node_row(run_id, position)
                nodes.setdefault(run_id, []).append(_text("run_nodes", "name", where, name))
                hosts.setdefault(run_id, set()).update({name, decode(
                    "run_nodes", "host_json", where, node_host).get("hostname", "")} - {""})
        found = []
        for r in rows:
            meta = decode("runs", "host_json", r[0], r[8])
            places = meta.get("targets") or meta.get("target") or ""
            summary = typed(RunSummary, "runs", r[0], {"hostname": "host_json"}, id=r[0],
                            suite_name=r[1], created_at=r[2], finished_at=r[3], status=r[4],
                            accelerator=r[5], trials_ok=r[6], trials_failed=r[7],
                            hostname=meta.get("hostname", ""), target=places,
                            nodes=tuple(nodes.get(r[0], ())))
            if ((suite is not None and r[1] != suite) or (since is not None and r[2] < since)
                    or (end is not None and r[2] >= end)):
                continue
            if (host is not None and host not in summary.hostname.split(", ")
                    and host not in hosts.get(r[0], ())):
                continue
            if target is not None and target not in places.split(", "):
                continue
            found.append(summary)
        return found

    def resolve(self, ref: str) -> int:
        """A run id from ``ref``: a number, or ``last``."""
        if ref == "last":
            row = self.conn.execute("SELECT MAX(id) FROM runs").fetchone()
            if row[0] is None:
                raise RunNotFound(f"{self.where}: no runs stored yet")
            if not isinstance(row[0], int):
                raise damaged("runs", "id", f"{row[0]!r:.40}", "not a number")
            return row[0]
        if not re.fullmatch(r"[0-9]+", ref):        # str.isdigit() takes "²" and "٣" too
            raise RunNotFound(f"run {ref!r}: give a run number or 'last'")
        # SQLite's integers have at most 19 digits: a longer number is no run's
        if len(ref) > 18 or self.conn.execute("SELECT 1 FROM runs WHERE id = ?",
                                              (int(ref),)).fetchone() is None:
            raise RunNotFound(f"{self.where}: no run "
                              f"{ref if len(ref) <= 40 else ref[:37] + '...'}")
        return int(ref)

    def load_run(self, run_id: int) -> StoredRun:
        row = self.conn.execute(
            "SELECT id, suite_name, suite_source, suite_text, created_at, finished_at, status, "
            "accelerator, iomatrix_version, host_json, notes_json, seed, "
            + ("suite_author" if self.version >= 11 else "NULL") + ", "
            + ("spec_json" if self.version >= 12 else "NULL") + " FROM runs WHERE id = ?",
            (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"{self.where}: no run {run_id}")
        spec = None if row[13] is None else decode("runs", "spec_json", run_id, row[13])
        suite = typed(StoredSuite, "runs", run_id, {"name": "suite_name", "source": "suite_source",
                                                    "text": "suite_text", "author": "suite_author",
                                                    "spec": "spec_json"},
                      name=row[1], source=row[2], text=row[3], author=row[12], spec=spec)
        host = decode("runs", "host_json", run_id, row[9])
        configs = tuple(
            typed(ConfigRecord, "configurations", r[0], {"params": "params_json"}, key=r[1],
                  label=r[2], mode=r[3], params=decode("configurations", "params_json", r[0], r[4]))
            for r in self.conn.execute("SELECT id, key, label, mode, params_json FROM "
                                       "configurations WHERE run_id = ? ORDER BY id", (run_id,)))
        workloads = tuple(
            typed(WorkloadRecord, "workloads", r[0], {"options": "options_json"}, key=r[1],
                  label=r[2], rw=r[3], bs=r[4], iodepth=r[5], numjobs=r[6], rate_iops=r[7],
                  options=decode("workloads", "options_json", r[0], r[8]))
            for r in self.conn.execute("SELECT id, key, label, rw, bs, iodepth, numjobs, "
                                       "rate_iops, options_json FROM workloads WHERE run_id = ? "
                                       "ORDER BY id", (run_id,)))
        trials = with_device_shares(self.conn, run_id, self._trials("t.run_id = ?", run_id),
                                    ramp_s=suite.method.ramp, fallback=stored_device(host))
        return typed(StoredRun, "runs", run_id, {"host": "host_json", "notes": "notes_json"},
                     id=row[0], suite=suite, created_at=row[4], finished_at=row[5], status=row[6],
                     accelerator=row[7], iomatrix_version=row[8], host=host,
                     notes=decode("runs", "notes_json", run_id, row[10]), seed=row[11],
                     configs=configs, workloads=workloads, trials=trials,
                     nodes=self._nodes(run_id) if self.version >= 10 else ())

    def _nodes(self, run_id: int) -> tuple[NodeRecord, ...]:
        """The nodes of a cluster run, in their order (schema 10)."""
        return tuple(
            typed(NodeRecord, "run_nodes", where, {"node": "node_json", "host": "host_json"},
                  name=r[0], node=decode("run_nodes", "node_json", where, r[1]),
                  host=decode("run_nodes", "host_json", where, r[2]), status=r[3], reason=r[4])
            for r in self.conn.execute("SELECT name, node_json, host_json, status, reason, "
                                       "position FROM run_nodes WHERE run_id = ? ORDER BY "
                                       "position", (run_id,))
            for where in [node_row(run_id, r[5])])

    def load_pilot(self, run_id: int) -> tuple[tuple[PilotTrial, ...], StoredPlan | None]:
        """A run's pilot trials and its trial plan (None: the run had no pilot, or it did not
        finish); a database older than schema 9 has neither."""
        if self.version < 9:
            return (), None
        trials = tuple(
            typed(PilotTrial, "pilot_trials", r[0], mode=r[1], config_key=r[2], workload_key=r[3],
                  round=r[4], runtime_s=r[5], iops=r[6], wall_s=r[7], session_s=r[8])
            for r in self.conn.execute(
                "SELECT id, mode, config_key, workload_key, round, runtime_s, iops, wall_s, "
                "session_s FROM pilot_trials WHERE run_id = ? ORDER BY id", (run_id,)))
        row = self.conn.execute("SELECT plan_json FROM trial_plans WHERE run_id = ?",
                                (run_id,)).fetchone()
        return trials, None if row is None else decode("trial_plans", "plan_json", run_id, row[0])

    def _trials(self, where: str, key: int) -> tuple[TrialRecord, ...]:
        """The trials ``where`` (a condition on ``t``, one parameter) says, with samples."""
        samples = self._samples("samples", where, key)
        vm_samples = self._samples("vm_samples", where, key)
        return tuple(
            typed(TrialRecord, "trials", r[0], _TRIAL_COLUMNS, id=r[0], config_key=r[1],
                  workload_key=r[2], sample_index=r[3], status=r[4], reason=r[5],
                  started_at=r[6], wall_seconds=r[7], accelerator=r[8], usr_cpu=r[9],
                  sys_cpu=r[10], ctx=r[11], applied=decode("trials", "applied_json", r[0], r[12]),
                  command=r[13], steady=decode("trials", "steady_json", r[0], r[14]),
                  cpu=decode("trials", "cpu_json", r[0], r[15]), tool=r[16],
                  stall=decode("trials", "stall_json", r[0], r[17]),
                  depth=decode("trials", "depth_json", r[0], r[18]),
                  logs=decode("trials", "logs_json", r[0], r[19]),
                  samples=tuple(samples.get(r[0], ())), vm_samples=tuple(vm_samples.get(r[0], ())))
            for r in self.conn.execute(
                "SELECT t.id, c.key, w.key, t.sample_index, t.status, t.reason, t.started_at, "
                "t.wall_seconds, t.accelerator, t.usr_cpu, t.sys_cpu, t.ctx, t.applied_json, "
                "t.command, t.steady_json, t.cpu_json, t.fio_version, t.stall_json, t.depth_json, "
                "t.logs_json "
                "FROM trials t "
                "JOIN configurations c ON c.id = t.configuration_id "
                f"JOIN workloads w ON w.id = t.workload_id WHERE {where} ORDER BY t.id",
                (key,)))


    def telemetry(self, trial_id: int) -> HostSeries | None:
        """The host time series recorded during a trial (disk utilization, interrupts, ...);
        None when it recorded none (failed, imported and older trials)."""
        row = self.conn.execute("SELECT telemetry_json FROM trials WHERE id = ?",
                                (trial_id,)).fetchone()
        return decode("trials", "telemetry_json", trial_id, row[0]) if row else None

    def fio_json(self, trial_id: int) -> str | None:
        """The raw fio JSON stored with a trial."""
        row = self.conn.execute("SELECT fio_json FROM trials WHERE id = ?", (trial_id,)).fetchone()
        return inflate("trials", "fio_json", trial_id, row[0]) if row else None

    # -- helpers ---------------------------------------------------------------------------
    def _samples(self, table: str, where: str, key: int) -> dict[int, list[DirectionSample]]:
        """Trial id → its rows of ``samples`` or ``vm_samples``, for the trials ``where``
        (a condition on ``t``, one parameter) says."""
        vm = "s.vm" if table == "vm_samples" else "NULL"
        out: dict[int, list[DirectionSample]] = {}
        for r in self.conn.execute(
                f"SELECT s.trial_id, {vm}, {', '.join('s.' + c for c in _SAMPLE_COLUMNS)} "
                f"FROM {table} s JOIN trials t ON t.id = s.trial_id WHERE {where} "
                f"ORDER BY s.trial_id, {'s.vm, ' if vm == 's.vm' else ''}s.direction", (key,)):
            out.setdefault(r[0], []).append(typed(DirectionSample, table, f"of trial {r[0]}",
                                                  vm=r[1], **dict(zip(_SAMPLE_COLUMNS, r[2:]))))
        return out

    def _retire_failed(self, run_id: int, cid: int, wid: int, sample_index: int) -> None:
        """Inside a transaction: move the failed trial of that key, with its samples, raw fio
        output and telemetry, to ``trial_history``; nothing when there is none."""
        row = self.conn.execute(
            "SELECT id, telemetry_json, fio_json FROM trials WHERE configuration_id = ? AND "
            "workload_id = ? AND sample_index = ? AND status = 'failed'",
            (cid, wid, sample_index)).fetchone()
        if row is None:
            return
        (old,) = self._trials("t.id = ?", row[0])
        self.conn.execute(
            "INSERT INTO trial_history (run_id, config_key, workload_key, sample_index, status, "
            "reason, started_at, retired_at, trial_json, telemetry_json, fio_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, old.config_key, old.workload_key, old.sample_index, old.status, old.reason,
             old.started_at, now(), old.model_dump_json(), row[1], row[2]))
        self.conn.execute("DELETE FROM trials WHERE id = ?", (row[0],))


def _stored_steady(steady: SteadyRecord | None) -> dict[str, Any]:
    """Steady state as stored since schema v4: flat, the verdict's fields beside "checked" and
    "source" (or "checked": false and "reason"); nothing for a failed trial."""
    if steady is None:
        return {}
    out: dict[str, Any] = steady.verdict.model_dump() if steady.verdict else {}
    out["checked"] = steady.checked
    for key in ("source", "reason"):
        if getattr(steady, key) is not None:
            out[key] = getattr(steady, key)
    return out


def node_row(run_id: object, position: object) -> str:
    """How a row of ``run_nodes`` (keyed by run and name) is named when it is damaged."""
    return f"{position} of run {run_id}"


def _text(table: str, column: str, row: object, value: Any) -> str:
    if not isinstance(value, str):
        raise damaged(table, column, row, "not text")
    return value


_TRIAL_COLUMNS = {"applied": "applied_json", "steady": "steady_json", "cpu": "cpu_json",
                  "stall": "stall_json", "depth": "depth_json", "logs": "logs_json",
                  "tool": "fio_version", "config_key": "configuration_id",
                  "workload_key": "workload_id"}
"""The columns of ``trials`` that a ``TrialRecord``'s fields are read from, where the names
differ."""
