"""Telemetry during trials, one probe per source: per-thread CPU time and context switches from
/proc (``procstat``), cycles and instructions from perf where the host has counters (``perf``),
host-wide disk, interrupt and context-switch rates sampled in the background (``host``), the
SNIA steady-state rule over a throughput series (``steady``), the share of a trial's I/O that
reached the target's device rather than the host page cache (``pagecache``), and the host's
metadata stored with every run (``hostinfo``)."""

from iomatrix.telemetry.host import DeviceSeries, HostSampler, HostSeries, device_of
from iomatrix.telemetry.pagecache import RAM_SHARE, DeviceShare, device_share, uses_page_cache
from iomatrix.telemetry.perf import PerfCounts, PerfStat, count, perf_problem
from iomatrix.telemetry.procstat import (ROLES, CpuCost, PerUnit, RoleCost, ThreadTimes, classify,
                                         cpu_delta, per_io, per_mb, process_tree, snapshot)

__all__ = ["DeviceSeries", "HostSampler", "HostSeries", "device_of", "PerfCounts", "PerfStat",
           "count", "perf_problem", "ROLES", "CpuCost", "PerUnit", "RoleCost", "ThreadTimes",
           "classify", "cpu_delta", "per_io", "per_mb", "process_tree", "snapshot", "RAM_SHARE",
           "DeviceShare", "device_share", "uses_page_cache"]
