"""A run's raw samples as CSV: what `iomatrix export` writes and the report offers for download."""

from __future__ import annotations

import csv
import io

from iomatrix.store.records import StoredRun


def samples_csv(stored: StoredRun) -> str:
    """One row per trial and direction (each guest's own rows follow the aggregate's)."""
    configs = {c.key: c for c in stored.configs}
    workloads = {w.key: w for w in stored.workloads}
    axes = sorted({k for c in stored.configs for k in c.params})
    fields = ["run", "configuration", "mode", *axes, "rw", "bs", "iodepth", "numjobs", "rate_iops",
              "sample", "status", "reason", "accelerator", "emulated", "vm", "direction", "iops",
              "bw_bytes", "lat_mean_ns", "lat_stdev_ns", "p50_ns", "p90_ns", "p99_ns", "p99_9_ns",
              "p99_99_ns", "usr_cpu", "sys_cpu", "ctx", "started_at"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for t in stored.trials:
        c, w = configs[t.config_key], workloads[t.workload_key]
        base = {"run": stored.id, "configuration": c.key, "mode": c.mode,
                **{a: c.params.get(a, "") for a in axes}, "rw": w.rw, "bs": w.bs,
                "iodepth": w.iodepth, "numjobs": w.numjobs, "rate_iops": w.rate_iops,
                "sample": t.sample_index, "status": t.status, "reason": t.reason or "",
                "accelerator": t.accelerator, "emulated": t.accelerator == "tcg",
                "usr_cpu": t.usr_cpu, "sys_cpu": t.sys_cpu, "ctx": t.ctx,
                "started_at": t.started_at}
        # the trial's samples (with several guests: their aggregate, vm empty), then each guest's
        for s in [*(t.samples or [None]), *t.vm_samples]:
            row = dict(base)
            if s is not None:
                row["vm"] = "" if s.vm is None else s.vm
                row.update({k: getattr(s, k) for k in ("direction", "iops", "bw_bytes",
                            "lat_mean_ns", "lat_stdev_ns", "p50_ns", "p90_ns", "p99_ns",
                            "p99_9_ns", "p99_99_ns")})
            writer.writerow(row)
    return buf.getvalue()
