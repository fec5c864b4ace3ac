"""A run's raw samples as CSV: what `iomatrix export` writes and the report offers for download."""

from __future__ import annotations

import csv
import io

from iomatrix.store.records import StoredRun, TrialRecord
from iomatrix.vocab.words import Accelerator


_SAMPLE_FIELDS = ("vm", "direction", "iops", "bw_bytes", "lat_mean_ns", "lat_stdev_ns", "p50_ns",
                  "p90_ns", "p99_ns", "p99_9_ns", "p99_99_ns")
"""The columns a sample fills (empty for a trial without one)."""


_STALL_FIELDS = ("stalled", "stalled_s", "stall_longest_s")
"""Whether the trial stalled (``iomatrix.fio.persecond``: True or False, empty where it was not
judged), the stalls' total length and the longest span without a completion, seconds."""


def _stall_columns(t: TrialRecord) -> list[object]:
    s = t.stall
    if s is None or not s.checked:
        return ["", "", ""]
    return [s.stalled, s.stalled_s, "" if s.longest_s is None else s.longest_s]


def samples_csv(stored: StoredRun) -> str:
    """One row per trial and direction (each guest's own rows follow the aggregate's)."""
    configs = {c.key: c for c in stored.configs}
    workloads = {w.key: w for w in stored.workloads}
    axes = sorted({k for c in stored.configs for k in c.params})
    fields = ["run", "configuration", "mode", *axes, "rw", "bs", "iodepth", "numjobs", "rate_iops",
              "sample", "status", "reason", "accelerator", "emulated", *_SAMPLE_FIELDS,
              "usr_cpu", "sys_cpu", "ctx", "started_at", *_STALL_FIELDS]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(fields)
    # The point's columns are the same on each of its rows: written once per point, as the
    # start of a line (the same dialect quotes each field on its own: the line is the same)
    start = io.StringIO()
    starter = csv.writer(start, lineterminator="\n")
    starts: dict[tuple[str, str], str] = {}
    for t in stored.trials:
        prefix = starts.get((t.config_key, t.workload_key))
        if prefix is None:
            c, w = configs[t.config_key], workloads[t.workload_key]
            start.seek(0)
            start.truncate()
            starter.writerow([stored.id, c.key, c.mode, *(c.params.get(a, "") for a in axes),
                              w.rw, w.bs, w.iodepth, w.numjobs, w.rate_iops, ""])
            prefix = starts[(t.config_key, t.workload_key)] = start.getvalue()[:-1]
        head = [t.sample_index, t.status, t.reason or "", t.accelerator, t.accelerator == Accelerator.TCG]
        tail = [t.usr_cpu, t.sys_cpu, t.ctx, t.started_at, *_stall_columns(t)]
        # the trial's samples (with several guests: their aggregate, vm empty), then each guest's
        for s in [*(t.samples or [None]), *t.vm_samples]:
            middle = [""] * len(_SAMPLE_FIELDS) if s is None else [
                "" if s.vm is None else s.vm, *(getattr(s, k) for k in _SAMPLE_FIELDS[1:])]
            buf.write(prefix)
            writer.writerow(head + middle + tail)
    return buf.getvalue()
