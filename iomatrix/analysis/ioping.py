"""A run's ioping figures (seed 001 §9, "IOPing Latenztest"): for each configuration and ioping
workload, the latency of its requests and which tool measured them.

An ioping workload is paced (one request per interval), so its IOPS are its pace, not a result:
its figure is the latency of a single read that misses the page cache. ioping prints it as
``min/avg/max/mdev`` and as "iops" = 1 / avg, the study's "IOPS in k" column. Here the mean is
over every request of every trial (each trial's mean weighted by its requests), with the 95 %
confidence interval of the trials' means; ``mdev`` is the population standard deviation of all
requests, as ioping's. Host-mode trials of a host with ioping were measured by ioping itself,
the others by fio's equivalent job (``iomatrix.fio.ioping``); ``measured_by`` says which, from
the tool each trial stored."""

from __future__ import annotations

import math
from collections import defaultdict

from iomatrix.analysis.stats import Interval, confidence_interval
from iomatrix.core.model import Frozen
from iomatrix.store.records import StoredRun, TrialRecord
from iomatrix.suite.workloads import Ioping
from iomatrix.vocab.words import TrialStatus



class IopingFigure(Frozen):
    """One configuration × ioping workload: its requests' latency (ns) and who measured it."""

    config_key: str
    workload_key: str
    measured_by: str
    """"ioping 1.3", or "fio-3.33 (ioping's equivalent)"; both, comma-separated, if mixed."""
    by_ioping: bool
    """Every trial was measured by ioping itself."""
    trials: int
    requests: int
    mean_ns: float
    mean_ci: Interval | None
    """95 % CI of the trials' mean latencies (t, or bootstrap when skewed); None below 2."""
    min_ns: float
    max_ns: float
    mdev_ns: float
    added_us: float | None = None
    """Mean latency minus bare metal's on the same workload (host mode, same run), in µs."""

    @property
    def iops(self) -> float:
        """ioping's "iops": one over the mean latency (the study's "IOPS in k" × 1000)."""
        return 1e9 / self.mean_ns


def is_ioping(workload_key: str) -> bool:
    """Whether a stored workload is an ioping workload."""
    return Ioping.of_key(workload_key) is not None


def tool_label(tool: str | None) -> str:
    """How a trial's stored tool is shown beside an ioping figure."""
    if tool is None:
        return "unknown tool"
    return tool if tool.startswith("ioping") else f"{tool} (ioping's equivalent)"


def ioping_figures(run: StoredRun) -> list[IopingFigure]:
    """Every configuration × ioping workload with ok trials, in the run's order."""
    wanted = [w.key for w in run.workloads if is_ioping(w.key)]
    groups: dict[tuple[str, str], list[TrialRecord]] = defaultdict(list)
    for t in run.trials:
        if (t.workload_key in wanted and t.status == TrialStatus.OK and t.samples
                and t.samples[0].lat_mean_ns is not None):
            groups[(t.config_key, t.workload_key)].append(t)
    out = []
    for config in run.configs:
        for key in wanted:
            trials = groups.get((config.key, key))
            if not trials:
                continue
            stats = [t.samples[0] for t in trials]
            counts = [s.total_ios for s in stats]
            means = [float(s.lat_mean_ns or 0.0) for s in stats]
            n = sum(counts)
            mean = sum(c * m for c, m in zip(counts, means)) / n
            # within-trial squares (sample stdev, n - 1) plus between-trial squares, over all n
            squares = sum((c - 1) * (s.lat_stdev_ns or 0.0) ** 2 + c * (m - mean) ** 2
                          for c, m, s in zip(counts, means, stats))
            tools = list(dict.fromkeys(tool_label(t.tool) for t in trials))
            out.append(IopingFigure(
                config_key=config.key, workload_key=key, measured_by=", ".join(tools),
                by_ioping=all((t.tool or "").startswith("ioping") for t in trials),
                trials=len(trials), requests=n, mean_ns=mean,
                mean_ci=confidence_interval(means) if len(means) >= 2 else None,
                min_ns=min(float(s.lat_min_ns or 0.0) for s in stats),
                max_ns=max(float(s.lat_max_ns or 0.0) for s in stats),
                mdev_ns=math.sqrt(squares / n)))
    # each point against the baseline of its own target (``host/target=NAME`` in a run of several)
    baseline = {c.key: str(c.identity.baseline) for c in run.configs}
    base = {(f.config_key, f.workload_key): f.mean_ns for f in out
            if f.config_key == baseline[f.config_key]}
    added = lambda f: base.get((baseline[f.config_key], f.workload_key))  # noqa: E731
    return [f if f.config_key == baseline[f.config_key] or added(f) is None else
            f.model_copy(update={"added_us": (f.mean_ns - added(f)) / 1000})
            for f in out]
